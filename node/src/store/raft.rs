//! [`RaftLockStore`]: the lock store over the Raft cluster — `lock_api::LockStore` and
//! `lock_api::SessionRegistry`, plus the inherent methods with explicit request ids and
//! server-side waiting that the gRPC layer calls.
//!
//! Owns the node-side rules of each operation: argument validation (`lock_api::validate`)
//! before anything is proposed, the leader check (`NotLeader` naming the leader), turning the
//! state machine's answers and rejections into `LockError`s, leader-local renewals and
//! heartbeats confirmed by a quorum round (D-lease), and waiting for a hand-off (D-wait).
//! Does not speak gRPC (see `grpc/`) and does not decide lock outcomes (the state machine does).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_api::{
    LockError, LockHandle, LockInfo, LockOutcome, LockStore, SessionRegistry, validate,
};
use lock_raft_store::storage::StateReader;
use lock_raft_store::{Command, Grant, Raft, Rejection, Response, Revocation};
use openraft::ReadPolicy;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{LinearizableReadError, RaftError};

use crate::clock::Clock;
use crate::confirm::Confirmer;
use crate::leases::{LeaseKeeper, REAP_PER_TICK_MAX, RenewCheck, reap_once};
use crate::log_limit::{LogLimit, Note};
use crate::proposer::{Proposer, not_leader};
use crate::waiters::{WaitOutcome, WaiterRegistry};

/// The current grant of a key and its queue length, as `inspect` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyState {
    /// The grant; its `expires_at_ms` is the best-known expiry (the leader's live lease when
    /// read on the leader, the last logged expiry elsewhere).
    pub grant: Grant,
    /// Queued acquires on the key.
    pub waiter_count: u32,
}

/// What the store is built from (see `server`).
#[derive(Clone)]
pub struct RaftLockStoreParts {
    /// This node's id.
    pub node_id: u64,
    /// The Raft node.
    pub raft: Raft,
    /// The proposer writing to `raft`.
    pub proposer: Proposer,
    /// Lease deadlines.
    pub keeper: Arc<LeaseKeeper>,
    /// Waiting acquires.
    pub waiters: Arc<WaiterRegistry>,
    /// Read view of the applied state.
    pub reader: StateReader,
    /// The node's clocks.
    pub clock: Arc<dyn Clock>,
    /// Turns `true` when the node starts shutting down: waiting acquires stop waiting.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for RaftLockStoreParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftLockStoreParts")
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

struct Inner {
    node_id: u64,
    raft: Raft,
    proposer: Proposer,
    keeper: Arc<LeaseKeeper>,
    waiters: Arc<WaiterRegistry>,
    reader: StateReader,
    clock: Arc<dyn Clock>,
    stop: tokio::sync::watch::Receiver<bool>,
    confirmer: Confirmer,
    /// Abandoned acquires whose cancel failed: one per client that walks away while the
    /// cluster cannot commit, so logged as a change of state with a summary a minute.
    cancel_failures: std::sync::Mutex<LogLimit>,
    /// Request ids for the trait methods, which carry none: a per-process counter seeded from
    /// the clock in microseconds, so ids keep growing across restarts of this process too.
    next_request_id: AtomicU64,
}

/// The lock store over the Raft cluster. Cheap to clone; every clone is the same store.
#[derive(Clone)]
pub struct RaftLockStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RaftLockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftLockStore")
            .field("node_id", &self.inner.node_id)
            .finish_non_exhaustive()
    }
}

/// Maps a rejection to the caller's error. `UnknownSession` is an invalid argument (terminal
/// for the session: its locks are gone); a stale request id is an unknown outcome.
fn rejected(rejection: Rejection) -> LockError {
    match rejection {
        Rejection::UnknownSession { session_id } => LockError::invalid(format!(
            "session {session_id:?} does not exist (never opened, closed or expired); its locks are gone"
        )),
        Rejection::InvalidArgument { message } | Rejection::LimitExceeded { message } => {
            LockError::invalid(message)
        }
        Rejection::StaleRequest {
            session_id,
            request_id,
        } => LockError::contention(format!(
            "unknown outcome: request {request_id} of session {session_id:?} is older than the remembered window; retry with a new request id"
        )),
    }
}

fn unexpected(what: &str, answer: &Response) -> LockError {
    tracing::error!(what, ?answer, "state machine answered unexpectedly");
    LockError::contention(format!(
        "unknown outcome: {what} was answered with {answer:?}"
    ))
}

/// Longest one leadership confirmation round may take. A round is one heartbeat to each
/// follower; a second means the quorum is not answering, and the caller retries.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

/// One leadership confirmation round on `raft`.
async fn ensure_leader(raft: &Raft) -> Result<(), LockError> {
    let Ok(confirmed) = tokio::time::timeout(
        CONFIRM_TIMEOUT,
        raft.ensure_linearizable(ReadPolicy::ReadIndex),
    )
    .await
    else {
        return Err(LockError::contention(format!(
            "leadership not confirmed within {CONFIRM_TIMEOUT:?}"
        )));
    };
    match confirmed {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => Err(not_leader(f)),
        Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e))) => Err(
            LockError::contention(format!("leadership not confirmed by a quorum: {e}")),
        ),
        Err(RaftError::Fatal(fatal)) => {
            Err(LockError::contention(format!("raft is stopped: {fatal}")))
        }
    }
}

/// One confirmation round, its failures logged as `failing` says: a leader that cannot confirm
/// its leadership fails every renewal and heartbeat round after round, and says so once when
/// that starts, once a minute while it lasts and once when it ends.
async fn confirm_round(
    raft: &Raft,
    clock: &dyn Clock,
    failing: &std::sync::Mutex<LogLimit>,
) -> Result<(), LockError> {
    let result = ensure_leader(raft).await;
    let now = clock.now();
    let mut failing = failing.lock().unwrap_or_else(|e| e.into_inner());
    match &result {
        Ok(()) => {
            if let Some(ended) = failing.succeeded(now) {
                tracing::info!(
                    failing_ms = ended.lasted.as_millis() as u64,
                    failed_rounds = ended.total,
                    "leadership confirmed again"
                );
            }
        }
        // Not a failure to confirm: this node no longer leads, and clients are sent on.
        Err(LockError::NotLeader { .. }) => {
            if let Some(ended) = failing.succeeded(now) {
                tracing::info!(
                    failing_ms = ended.lasted.as_millis() as u64,
                    failed_rounds = ended.total,
                    "leadership no longer confirmed: this node is not the leader"
                );
            }
        }
        Err(err) => match failing.failed(now, err) {
            None => {}
            Some(Note::Began) => tracing::warn!(
                error = %err,
                "leadership not confirmed; renewals and heartbeats fail until a quorum answers"
            ),
            Some(Note::Summary(s)) => tracing::warn!(
                failing_s = s.lasted.as_secs(),
                failed_rounds = s.count,
                last_error = %s.last_error,
                "leadership still not confirmed"
            ),
        },
    }
    result
}

/// Longest a proposal may take to commit and apply before the call answers "unknown outcome".
///
/// A leader cut off from its majority keeps its role until it hears of a newer term, and its
/// proposals wait forever; a client call must not (C2: every method but `acquire` is one round
/// trip). Five seconds is several election timeouts: a healthy cluster commits in milliseconds,
/// and a failover completes well within it.
pub const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(5);

fn ttl_ms(ttl_ms: u64) -> Result<u64, LockError> {
    validate::ttl(Duration::from_millis(ttl_ms))
}

impl RaftLockStore {
    /// Builds the store from its parts.
    pub fn new(parts: RaftLockStoreParts) -> Self {
        let seed = parts.clock.wall_ms().saturating_mul(1_000);
        let confirmer = Confirmer::new({
            let raft = parts.raft.clone();
            let clock = parts.clock.clone();
            let failing = Arc::new(std::sync::Mutex::new(LogLimit::default()));
            Arc::new(move || {
                let (raft, clock, failing) = (raft.clone(), clock.clone(), failing.clone());
                Box::pin(async move { confirm_round(&raft, &*clock, &failing).await })
            })
        });
        Self {
            inner: Arc::new(Inner {
                node_id: parts.node_id,
                raft: parts.raft,
                proposer: parts.proposer,
                keeper: parts.keeper,
                waiters: parts.waiters,
                reader: parts.reader,
                clock: parts.clock,
                stop: parts.stop,
                confirmer,
                cancel_failures: std::sync::Mutex::new(LogLimit::default()),
                next_request_id: AtomicU64::new(seed.max(1)),
            }),
        }
    }

    /// The Raft node (for the admin service).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// A fresh request id for calls that carry none.
    pub fn next_request_id(&self) -> u64 {
        self.inner.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    /// `NotLeader` naming the leader this node knows of, with its address from the membership.
    pub fn not_leader(&self) -> LockError {
        let metrics = self.inner.raft.server_metrics();
        let m = metrics.borrow_watched();
        let leader_id = m
            .current_leader
            .filter(|id| *id != self.inner.node_id || m.state == ServerState::Leader);
        let leader_addr = leader_id.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|node| node.addr.clone())
        });
        LockError::NotLeader {
            leader_id,
            leader_addr,
        }
    }

    /// `Ok` if this node is the leader, else `NotLeader`.
    pub fn leader_check(&self) -> Result<(), LockError> {
        if self.inner.raft.server_metrics().borrow_watched().state == ServerState::Leader {
            Ok(())
        } else {
            Err(self.not_leader())
        }
    }

    /// `Ok` if this node leads and its promote applied in this term, so its lease deadlines are
    /// authoritative.
    fn leases_ready(&self) -> Result<(), LockError> {
        self.leader_check()?;
        let term = self
            .inner
            .raft
            .server_metrics()
            .borrow_watched()
            .vote
            .leader_id
            .term;
        if self.inner.keeper.promoted_term() == Some(term) {
            Ok(())
        } else {
            Err(LockError::contention(
                "this node just became leader and is restarting leases; retry shortly",
            ))
        }
    }

    /// Confirms leadership with a quorum round and no log write (openraft
    /// `ensure_linearizable`), so a deposed leader cannot hand out a deadline the new leader
    /// will not honour. Concurrent callers share rounds (see [`crate::confirm`]).
    pub async fn confirm_leadership(&self) -> Result<(), LockError> {
        self.inner.confirmer.confirm().await
    }

    async fn propose(&self, command: Command) -> Result<Response, LockError> {
        match tokio::time::timeout(PROPOSAL_TIMEOUT, self.inner.proposer.propose(command)).await {
            Ok(answer) => answer,
            Err(_) => Err(LockError::contention(format!(
                "unknown outcome: not committed within {PROPOSAL_TIMEOUT:?} (no majority reachable?); retry with the same request id"
            ))),
        }
    }

    /// Resolves once the node starts shutting down.
    /// Turns `true` when the node starts shutting down (see [`RaftLockStoreParts::stop`]).
    pub fn stop_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.stop.clone()
    }

    async fn stopping(&self) {
        let mut stop = self.inner.stop.clone();
        // A dropped sender means the node is gone: treat it as stopping too.
        let _ = stop.wait_for(|stopping| *stopping).await;
    }

    /// Opens a session for `owner_id` with a lease of `ttl_ms`; returns its id and TTL.
    pub async fn open(
        &self,
        owner_id: &str,
        ttl_ms_requested: u64,
    ) -> Result<(String, u64), LockError> {
        validate::owner_id(owner_id)?;
        let ttl = ttl_ms(ttl_ms_requested)?;
        self.leader_check()?;
        // 32 hex characters: within SESSION_ID_LEN_MAX, unguessable, picked here so every
        // replica records the same id.
        let session_id = uuid::Uuid::new_v4().simple().to_string();
        match self
            .propose(Command::OpenSession {
                session_id,
                owner_id: owner_id.to_owned(),
                ttl_ms: ttl,
            })
            .await?
        {
            Response::SessionOpened { session_id, ttl_ms } => Ok((session_id, ttl_ms)),
            Response::Rejected(r) => Err(rejected(r)),
            other => Err(unexpected("OpenSession", &other)),
        }
    }

    /// Restarts a session's lease (leader-local, leadership-confirmed). `Ok(None)` is terminal:
    /// the session is gone, lapsed or being expired.
    pub async fn keep_alive(&self, session_id: &str) -> Result<Option<u64>, LockError> {
        validate::session_id(session_id)?;
        self.leases_ready()?;
        let Some(ttl) = self.inner.keeper.heartbeat_session(session_id) else {
            return Ok(None);
        };
        self.confirm_leadership().await?;
        Ok(Some(ttl))
    }

    /// [`RaftLockStore::keep_alive`] for many sessions at once (`SessionService.HeartbeatBatch`):
    /// one leader check, every lease restarted under one lock of the lease table, and ONE
    /// leadership-confirmation round for the whole batch instead of one per session. Each
    /// session's answer is what `keep_alive` gives it: `Ok(Some(ttl))` alive, `Ok(None)`
    /// terminal, `Err(InvalidArgument)` for a malformed id. The whole call fails as
    /// `keep_alive` does: `NotLeader`, or `Contention` while leases restart or when the round
    /// fails. The caller bounds the batch (the gRPC layer refuses one over
    /// `lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX`), which bounds how long the lease
    /// table stays locked.
    pub async fn keep_alive_batch(
        &self,
        session_ids: &[String],
    ) -> Result<Vec<Result<Option<u64>, LockError>>, LockError> {
        self.leases_ready()?;
        let checked: Vec<Result<(), LockError>> = session_ids
            .iter()
            .map(|id| validate::session_id(id))
            .collect();
        let mut ttls = self
            .inner
            .keeper
            .heartbeat_sessions(
                session_ids
                    .iter()
                    .zip(&checked)
                    .filter(|(_, ok)| ok.is_ok())
                    .map(|(id, _)| id.as_str()),
            )
            .into_iter();
        let answers: Vec<Result<Option<u64>, LockError>> = checked
            .into_iter()
            .map(|ok| ok.map(|()| ttls.next().flatten()))
            .collect();
        // As in `keep_alive`: the extensions above happened before the round, and only a
        // restarted lease needs the proof that this node still leads.
        if answers.iter().any(|a| matches!(a, Ok(Some(_)))) {
            self.confirm_leadership().await?;
        }
        Ok(answers)
    }

    /// Closes a session, releasing its grants; returns how many (0 if it was already gone).
    pub async fn close(&self, session_id: &str) -> Result<u32, LockError> {
        validate::session_id(session_id)?;
        self.leader_check()?;
        match self
            .propose(Command::CloseSession {
                session_id: session_id.to_owned(),
            })
            .await?
        {
            Response::SessionClosed { locks_released } => Ok(locks_released),
            Response::Rejected(Rejection::UnknownSession { .. }) => Ok(0),
            Response::Rejected(r) => Err(rejected(r)),
            other => Err(unexpected("CloseSession", &other)),
        }
    }

    /// The keys a session holds, read on the leader (empty for a session that is gone).
    pub async fn keys_of(&self, session_id: &str) -> Result<BTreeSet<String>, LockError> {
        validate::session_id(session_id)?;
        self.leader_check()?;
        Ok(self.inner.reader.read(|table| table.locks_of(session_id)))
    }

    /// Single-shot acquire: `Ok(None)` if the key is held.
    pub async fn try_acquire(
        &self,
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
            .propose(Command::Acquire {
                session_id: session_id.to_owned(),
                request_id,
                key: key.to_owned(),
                ttl_ms: ttl,
                wait_ms: 0,
            })
            .await?
        {
            Response::Granted(grant) => Ok(Some(grant)),
            Response::NotGranted => Ok(None),
            Response::Rejected(r) => Err(rejected(r)),
            other => Err(unexpected("Acquire", &other)),
        }
    }

    /// Acquires `key`, waiting server-side up to `max_wait_ms` (D-wait): `Ok(Some)` once
    /// granted, `Ok(None)` if `max_wait_ms` elapsed while the key was held. If the returned
    /// future is dropped while waiting (the client went away), the wait is cancelled and a
    /// grant that raced the cancellation is released.
    pub async fn acquire(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl_ms_requested: u64,
        max_wait_ms: u64,
    ) -> Result<Option<Grant>, LockError> {
        let max_wait_ms = validate::max_wait(Duration::from_millis(max_wait_ms))?;
        if max_wait_ms == 0 {
            return self
                .try_acquire(session_id, request_id, key, ttl_ms_requested)
                .await;
        }
        validate::session_id(session_id)?;
        validate::key(key)?;
        let ttl = ttl_ms(ttl_ms_requested)?;
        self.leader_check()?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(max_wait_ms);
        // Registered before proposing, so a hand-off applied before our answer is not missed.
        let mut slot = self.inner.waiters.register(session_id, request_id);
        let mut guard = CancelOnDrop {
            store: self.clone(),
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            armed: true,
        };
        let answer = self
            .propose(Command::Acquire {
                session_id: session_id.to_owned(),
                request_id,
                key: key.to_owned(),
                ttl_ms: ttl,
                wait_ms: max_wait_ms,
            })
            .await;
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
            Response::Granted(grant) => {
                guard.armed = false;
                Ok(Some(grant))
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
                    Ok(Some(WaitOutcome::Granted(grant))) => {
                        guard.armed = false;
                        Ok(Some(grant))
                    }
                    Ok(Some(WaitOutcome::Dropped)) => {
                        guard.armed = false;
                        Ok(None)
                    }
                    // max_wait elapsed (or a retry took over the slot): withdraw the waiter. A
                    // grant that raced the withdrawal is the caller's, so keep it.
                    Ok(None) | Err(_) => {
                        let cancelled = self
                            .propose(Command::CancelWait {
                                session_id: session_id.to_owned(),
                                request_id,
                                key: key.to_owned(),
                                release_if_granted: false,
                            })
                            .await?;
                        guard.armed = false;
                        match cancelled {
                            Response::WaitCancelled { grant, .. } => Ok(grant),
                            Response::Rejected(Rejection::UnknownSession { session_id }) => {
                                Err(rejected(Rejection::UnknownSession { session_id }))
                            }
                            Response::Rejected(r) => Err(rejected(r)),
                            other => Err(unexpected("CancelWait", &other)),
                        }
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
    pub async fn cancel_acquire(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        self.leader_check()?;
        match self
            .propose(Command::CancelWait {
                session_id: session_id.to_owned(),
                request_id,
                key: key.to_owned(),
                release_if_granted: true,
            })
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
    pub async fn renew(
        &self,
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
        let (lease, previous_ttl_ms) = match self.inner.keeper.renew_grant(key, token, ttl) {
            RenewCheck::Lost => return Ok(None),
            RenewCheck::Extended {
                lease,
                previous_ttl_ms,
            } => (lease, previous_ttl_ms),
        };
        let wall_now = self.inner.clock.wall_ms();
        self.confirm_leadership().await?;
        if previous_ttl_ms != ttl {
            match self
                .propose(Command::Renew {
                    session_id: lease.session_id.clone(),
                    request_id,
                    key: key.to_owned(),
                    token,
                    ttl_ms: ttl,
                })
                .await?
            {
                Response::Renewed(_) => {}
                Response::Lost => return Ok(None),
                Response::Rejected(Rejection::UnknownSession { .. }) => return Ok(None),
                Response::Rejected(r) => return Err(rejected(r)),
                other => return Err(unexpected("Renew", &other)),
            }
        }
        let acquired_at_ms = self.inner.reader.read(|table| {
            table
                .grant(key)
                .filter(|g| g.token == token)
                .map(|g| (g.acquired_at_ms, g.request_id))
        });
        let Some((acquired_at_ms, grant_request_id)) = acquired_at_ms else {
            // Freed between the check and now (released, revoked, session ended).
            return Ok(None);
        };
        Ok(Some(Grant {
            key: key.to_owned(),
            owner_id: lease.owner_id,
            session_id: lease.session_id,
            request_id: grant_request_id,
            token,
            ttl_ms: ttl,
            acquired_at_ms,
            expires_at_ms: wall_now + ttl,
        }))
    }

    /// Compare-and-delete of grant `(key, token)`. `Ok(false)` if it was already gone.
    pub async fn release(
        &self,
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
            .propose(Command::Release {
                session_id: session_id.to_owned(),
                request_id,
                key: key.to_owned(),
                token,
            })
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
    pub async fn inspect(
        &self,
        key: &str,
        leader_confirmed: bool,
    ) -> Result<Option<KeyState>, LockError> {
        validate::key(key)?;
        if leader_confirmed {
            self.leases_ready()?;
            self.confirm_leadership().await?;
        }
        let state = self.inner.reader.read(|table| {
            table.grant(key).cloned().map(|grant| KeyState {
                waiter_count: table.waiter_count(key),
                grant,
            })
        });
        Ok(state.map(|mut state| {
            // On the promoted leader the live lease is the better expiry than the last one
            // logged (renewals are not logged).
            if self.leases_ready().is_ok()
                && let Some(lease) = self.inner.keeper.grant_lease(key)
                && lease.token == state.grant.token
            {
                let left = lease
                    .deadline
                    .saturating_duration_since(self.inner.clock.now());
                state.grant.expires_at_ms = self.inner.clock.wall_ms() + left.as_millis() as u64;
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
    pub async fn force_revoke(
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
        tracing::warn!(
            key,
            operator,
            reason,
            request_id,
            previous_token = ?revocation.previous_token,
            new_token_floor = revocation.new_token_floor,
            "force revoke"
        );
        Ok(revocation)
    }
}

/// Cancels a waiting acquire whose caller went away (its future was dropped), releasing a
/// grant that raced the cancellation (C2 §2.8: interrupting `acquire` releases a grant already
/// recorded). Disarmed on every path where the caller learns the outcome.
struct CancelOnDrop {
    store: RaftLockStore,
    session_id: String,
    request_id: u64,
    key: String,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        let command = Command::CancelWait {
            session_id: std::mem::take(&mut self.session_id),
            request_id: self.request_id,
            key: std::mem::take(&mut self.key),
            release_if_granted: true,
        };
        runtime.spawn(async move {
            let result = store.propose(command).await;
            let now = store.inner.clock.now();
            let mut failing = store
                .inner
                .cancel_failures
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match result {
                Ok(answer) => {
                    tracing::debug!(?answer, "abandoned acquire cancelled");
                    if let Some(ended) = failing.succeeded(now) {
                        tracing::info!(
                            failing_ms = ended.lasted.as_millis() as u64,
                            failed_cancels = ended.total,
                            "abandoned acquires are cancelled again"
                        );
                    }
                }
                Err(err) => match failing.failed(now, &err) {
                    None => {}
                    Some(Note::Began) => tracing::info!(
                        %err,
                        "could not cancel an abandoned acquire; its wait deadline will drop it"
                    ),
                    Some(Note::Summary(s)) => tracing::info!(
                        failing_s = s.lasted.as_secs(),
                        failed_cancels = s.count,
                        last_error = %s.last_error,
                        "abandoned acquires still not cancelled; their wait deadlines drop them"
                    ),
                },
            }
        });
    }
}

fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

impl RaftLockStore {
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

impl LockStore for RaftLockStore {
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
            .try_acquire(session_id, self.next_request_id(), key, ttl_ms)
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
        let Some(lease) = self.inner.keeper.grant_lease(key) else {
            validate::key(key)?;
            return Ok(None);
        };
        let grant = self
            .renew(
                &lease.session_id,
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
        let holder = self.inner.reader.read(|table| {
            table
                .grant(key)
                .filter(|g| g.token == fencing_token)
                .map(|g| g.session_id.clone())
        });
        let Some(session_id) = holder else {
            return Ok(false);
        };
        self.release(&session_id, self.next_request_id(), key, fencing_token)
            .await
    }

    async fn read(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        Ok(self.inspect(key, false).await?.map(|state| LockInfo {
            key: state.grant.key,
            owner_id: state.grant.owner_id,
            session_id: state.grant.session_id,
            fencing_token: state.grant.token,
            acquired_at: system_time(state.grant.acquired_at_ms),
            expires_at: system_time(state.grant.expires_at_ms),
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

impl SessionRegistry for RaftLockStore {
    async fn open_session(&self, owner_id: &str, ttl: Duration) -> Result<String, LockError> {
        let ttl_ms = validate::ttl(ttl)?;
        Ok(self.open(owner_id, ttl_ms).await?.0)
    }

    /// The session's TTL was fixed when it was opened; `ttl` must be valid but does not change
    /// it (the wire protocol's heartbeat carries none).
    async fn heartbeat(&self, session_id: &str, ttl: Duration) -> Result<bool, LockError> {
        validate::ttl(ttl)?;
        Ok(self.keep_alive(session_id).await?.is_some())
    }

    async fn close_session(&self, session_id: &str) -> Result<usize, LockError> {
        Ok(self.close(session_id).await? as usize)
    }

    async fn locks_of(&self, session_id: &str) -> Result<BTreeSet<String>, LockError> {
        self.keys_of(session_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_map_to_the_contract_errors() {
        assert!(matches!(
            rejected(Rejection::UnknownSession {
                session_id: "s".into()
            }),
            LockError::InvalidArgument { .. }
        ));
        assert!(matches!(
            rejected(Rejection::LimitExceeded {
                message: "waiters".into()
            }),
            LockError::InvalidArgument { .. }
        ));
        let LockError::Contention { message } = rejected(Rejection::StaleRequest {
            session_id: "s".into(),
            request_id: 3,
        }) else {
            panic!("stale is contention");
        };
        assert!(message.contains("unknown outcome"), "{message}");
    }
}
