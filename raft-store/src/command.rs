//! What the Raft log carries ([`Request`], [`Command`]) and what applying it answers
//! ([`Response`], [`Event`]). This file is the contract between the leader that proposes, the
//! pure state machine that applies, and the storage that persists; it holds types only.
//!
//! Times are milliseconds. `*_ms` durations; `*_at_ms` instants on the **leader's stamp clock**
//! (wall-clock milliseconds since the Unix epoch, clamped by the leader so stamps never go
//! backwards, docs/DESIGN.md D-time). The state machine reads no clock: every time it uses comes
//! from [`Request::stamp_ms`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::table::ApplyLimits;

/// One log entry's application data: a command and the leader's time stamp for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The proposing leader's wall clock in ms since the Unix epoch, never below the stamp of
    /// any entry it applied before (D-time). `apply` uses this and no other clock.
    pub stamp_ms: u64,
    /// What to do.
    pub command: Command,
}

impl std::fmt::Display for Request {
    /// A one-line summary for openraft's logs: the command's name (and, for a batch, its
    /// size) and the stamp. Keys and ids stay out of it, so log lines stay short.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.command.name(), self.stamp_ms)?;
        if let Command::Batch(commands) = &self.command {
            write!(f, "[{}]", commands.len())?;
        }
        Ok(())
    }
}

impl Command {
    /// The command's name, as in `OpenSession`.
    pub fn name(&self) -> &'static str {
        match self {
            Command::OpenSession { .. } => "OpenSession",
            Command::CloseSession { .. } => "CloseSession",
            Command::ExpireSession { .. } => "ExpireSession",
            Command::Acquire { .. } => "Acquire",
            Command::Release { .. } => "Release",
            Command::Renew { .. } => "Renew",
            Command::CancelWait { .. } => "CancelWait",
            Command::ForceRevoke { .. } => "ForceRevoke",
            Command::ExpireLock { .. } => "ExpireLock",
            Command::Promote => "Promote",
            Command::Batch(_) => "Batch",
            Command::SetLimits { .. } => "SetLimits",
            Command::AsCaller { command, .. } => command.name(),
        }
    }
}

/// Every state change the lock cluster makes. Mutating client commands carry
/// `(session_id, request_id)` so a retried request gets the remembered answer instead of acting
/// twice (D-idempotency).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Opens a session. The leader picks `session_id` (random) before proposing, so every
    /// replica records the same id. Opening an id that exists answers it again (idempotent).
    OpenSession {
        /// New session's id.
        session_id: String,
        /// The owner the session acts for.
        owner_id: String,
        /// Session lease length.
        ttl_ms: u64,
    },
    /// Closes a session: releases its grants (handing each key to its next waiter) and drops
    /// its waiters. Answers [`Response::SessionClosed`]; an unknown session closes 0 locks.
    CloseSession {
        /// The session.
        session_id: String,
    },
    /// The leader's reaper found the session's lease lapsed. Same effect as `CloseSession`.
    ExpireSession {
        /// The session.
        session_id: String,
    },
    /// Acquires `key` for the session. `wait_ms == 0` is single-shot (answers `Granted` or
    /// `NotGranted`); otherwise a held key queues a waiter until `stamp_ms + wait_ms`
    /// (answers `Queued`), granted later by a hand-off (D-wait).
    Acquire {
        /// Requesting session.
        session_id: String,
        /// Idempotency id, unique per session.
        request_id: u64,
        /// Key to lock.
        key: String,
        /// Lease length of the grant.
        ttl_ms: u64,
        /// How long to wait in the queue; 0 = do not queue.
        wait_ms: u64,
    },
    /// Compare-and-delete of the grant `(key, token)`; frees the key for the next waiter.
    Release {
        /// Releasing session.
        session_id: String,
        /// Idempotency id.
        request_id: u64,
        /// Key.
        key: String,
        /// The grant's fencing token.
        token: u64,
    },
    /// Checks that `(key, token)` is still the grant and records a new expiry of
    /// `stamp_ms + ttl_ms`. Leaders normally renew leader-locally without a log write (D-lease);
    /// this command is the replicated form.
    Renew {
        /// Renewing session.
        session_id: String,
        /// Idempotency id.
        request_id: u64,
        /// Key.
        key: String,
        /// The grant's fencing token.
        token: u64,
        /// New lease length.
        ttl_ms: u64,
    },
    /// Withdraws the waiter that `Acquire { request_id }` queued. If that acquire was already
    /// granted and `release_if_granted` is set, releases the grant in the same step (a client
    /// that disconnected must not be left holding a lock it never learned of).
    CancelWait {
        /// Waiting session.
        session_id: String,
        /// The request id of the `Acquire` that queued the waiter.
        request_id: u64,
        /// Key waited on.
        key: String,
        /// Release a grant that raced the cancellation.
        release_if_granted: bool,
    },
    /// Break-glass: deletes the grant regardless of owner, advances the token floor past it and
    /// appends an audit record, in one step (FR-08, INV-04). Then hands the key off.
    ForceRevoke {
        /// Key.
        key: String,
        /// Who revoked (audit).
        operator: String,
        /// Why (audit).
        reason: String,
        /// The caller's id for this revoke, so a retry after a lost answer (possibly at a new
        /// leader) answers the first outcome instead of revoking again — a second revoke would
        /// displace the *next* holder. A revoke with the same `(key, operator, request_id)`
        /// within `limits::REVOKE_RETRY_WINDOW_MS` of the first is a retry; `0` is never one.
        request_id: u64,
    },
    /// The leader's reaper found the lease of grant `(key, token)` lapsed. Conditional on the
    /// token, so a stale expiry never removes a newer grant.
    ExpireLock {
        /// Key.
        key: String,
        /// Token of the lapsed grant.
        token: u64,
    },
    /// A new leader's first command once its term's blank entry applied: restarts every grant's
    /// and session's lease at `stamp_ms + ttl_ms` (etcd's lessor "promote"), so no lease ends
    /// early because leadership moved.
    Promote,
    /// Many commands in one entry (D-batch), applied in order as if proposed one by one, each
    /// with the batch's stamp; answered by [`Response::Batch`] in the same order. Batches do not
    /// nest.
    Batch(Vec<Command>),
    /// Moves the cluster to new apply limits (issue 18): from this entry on, every replica
    /// enforces `limits`, whatever its binary's constants say. Answers
    /// [`Response::LimitsSet`]; refused (`InvalidArgument`, nothing changes) if the limits are
    /// inconsistent or the current state already exceeds one of them (more sessions than the
    /// new `sessions_max`, a fuller queue, window or audit log). State admitted under the old
    /// limits that only argument bounds cover (a longer key, a longer lease) stays until it
    /// ends. Last in the enum, so every other command keeps its encoding.
    SetLimits {
        /// The limits to apply from now on.
        limits: ApplyLimits,
    },
    /// `command` as the authenticated principal `principal` called it (docs/SECURITY.md §3,
    /// D-session-principal). An `OpenSession` inside binds the new session to `principal`; a
    /// command presenting a session (close, acquire, release, renew, cancel) whose session, or
    /// whose grant's session, is bound to another principal is refused
    /// ([`Rejection::PermissionDenied`]) and changes nothing. The check is made here, at apply,
    /// so it holds on every replica and at any leader, whatever that leader had applied when it
    /// accepted the call. A command without this wrapper (an `--insecure` node, the leader's
    /// own reaper and promote, a log written before it existed) is nobody's in particular and
    /// opens an unbound session. Must not hold a `Batch` or another `AsCaller`. Last in the
    /// enum, after `SetLimits`, so every earlier command keeps its encoding and old logs
    /// replay.
    AsCaller {
        /// The caller's principal.
        principal: String,
        /// What it asked for.
        command: Box<Command>,
    },
}

/// A grant as the replicated state records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Locked key.
    pub key: String,
    /// Holder's owner id.
    pub owner_id: String,
    /// Holder's session.
    pub session_id: String,
    /// The `Acquire` request that produced this grant (lets a waiting RPC recognise its grant).
    pub request_id: u64,
    /// Fencing token, unique and increasing (D-token).
    pub token: u64,
    /// Lease length.
    pub ttl_ms: u64,
    /// Stamp of the grant.
    pub acquired_at_ms: u64,
    /// Stamp-clock expiry as last recorded in the log (grant, `Renew`, `Promote`). Informational:
    /// the leader's in-memory lease decides expiry and applies it as `ExpireLock`.
    pub expires_at_ms: u64,
}

/// The audit record of one force-revoke (C2 `lock_revocation`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Key.
    pub key: String,
    /// Who.
    pub operator: String,
    /// Why.
    pub reason: String,
    /// Displaced holder's owner id, if the key was held.
    pub previous_owner_id: Option<String>,
    /// Displaced grant's token, if the key was held.
    pub previous_token: Option<u64>,
    /// Token floor after the revoke: every later token is greater.
    pub new_token_floor: u64,
    /// Stamp of the revoke.
    pub at_ms: u64,
    /// The revoke's request id (0 if the caller gave none); see `Command::ForceRevoke`.
    pub request_id: u64,
}

/// Why a command was refused without changing anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    /// The session does not exist (never opened, closed or expired). For a client this is
    /// terminal for the session: its locks are gone.
    UnknownSession {
        /// The session named.
        session_id: String,
    },
    /// An argument broke a rule of `lock_api::validate` (blank, too long, out of bounds).
    InvalidArgument {
        /// Names the argument and the limit.
        message: String,
    },
    /// A replicated-state limit was reached (waiters per key, locks per session, ...).
    LimitExceeded {
        /// Names the limit and its value.
        message: String,
    },
    /// The request id is older than the session's window of remembered answers, so its
    /// outcome can no longer be told; the client must not assume either outcome.
    StaleRequest {
        /// The session.
        session_id: String,
        /// The request id presented.
        request_id: u64,
    },
    /// `principal` presented a session (or a grant of a session) that another principal
    /// opened (`Command::AsCaller`). Last in the enum, so every other rejection keeps its
    /// encoding in remembered answers.
    PermissionDenied {
        /// The caller's principal.
        principal: String,
        /// The session it presented, or the one whose grant it presented.
        session_id: String,
    },
}

/// What applying one command answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// `OpenSession` succeeded.
    SessionOpened {
        /// Session id.
        session_id: String,
        /// Session lease length.
        ttl_ms: u64,
    },
    /// `CloseSession` / `ExpireSession`: how many grants were released (0 if the session was
    /// already gone).
    SessionClosed {
        /// Grants released.
        locks_released: u32,
    },
    /// `Acquire` granted now.
    Granted(Grant),
    /// `Acquire` with a wait found the key held and queued a waiter at `position` (1 = next).
    Queued {
        /// 1-based position in the key's queue.
        position: u32,
    },
    /// `Acquire` not granted: single-shot on a held key, or a wait that ended ungranted.
    NotGranted,
    /// `Release`: whether this `(key, token)` was the grant removed.
    Released {
        /// `true` if removed, `false` if it had already gone (informational, C2).
        released: bool,
    },
    /// `Renew` succeeded: same token, later expiry.
    Renewed(Grant),
    /// `Renew` found `(key, token)` no longer the grant: LOST NOW (terminal).
    Lost,
    /// `CancelWait`.
    WaitCancelled {
        /// The waiter was still queued and has been removed.
        removed: bool,
        /// The acquire had already been granted; this is that grant.
        grant: Option<Grant>,
        /// That grant was released by this command (`release_if_granted`).
        released: bool,
    },
    /// `ForceRevoke`: the audit record, which is also the caller's outcome.
    Revoked(Revocation),
    /// `ExpireLock`: whether `(key, token)` was still the grant and is now removed.
    LockExpired {
        /// Removed by this command.
        expired: bool,
    },
    /// `Promote`: how many leases were restarted.
    Promoted {
        /// Grants restarted.
        grants: u32,
        /// Sessions restarted.
        sessions: u32,
    },
    /// `Batch`: one answer per command, in order.
    Batch(Vec<Response>),
    /// The command was refused and changed nothing.
    Rejected(Rejection),
    /// An entry without a command (a leader's blank entry, a membership change) was applied;
    /// nobody waits for this answer.
    NoCommand,
    /// `SetLimits`: the limits every replica now applies under.
    LimitsSet {
        /// The new limits.
        limits: ApplyLimits,
    },
}

/// Why a grant stopped existing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FreeCause {
    /// `Release` or `CancelWait { release_if_granted }`.
    Released,
    /// `ExpireLock`.
    Expired,
    /// `ForceRevoke`.
    Revoked,
    /// Its session was closed or expired.
    SessionEnded,
}

/// Side effects of an apply that someone outside the state machine must learn about: the
/// leader's lease keeper tracks grants and sessions, and a waiting `Acquire` RPC learns of its
/// hand-off. Emitted in apply order on every replica (replicas other than the leader may ignore
/// them).
///
/// Not serialized: events live only between an apply and its observer, and carry the table's
/// own shared keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A grant was made, directly by an `Acquire` or by a hand-off to a waiter.
    Granted {
        /// The grant (its `request_id` names the `Acquire` it answers).
        grant: Grant,
        /// `grant.key` as the lock table holds it, one allocation shared by the table, the
        /// session's lock set and whoever keeps it from this event (the lease keeper keys its
        /// record with it, so a million held locks are not a million more key copies).
        shared_key: Arc<str>,
        /// `true` when a queued waiter was granted because the key was freed.
        handed_off: bool,
    },
    /// A grant ended.
    Freed {
        /// Key.
        key: String,
        /// The ended grant's token.
        token: u64,
        /// Why.
        cause: FreeCause,
    },
    /// A queued waiter left the queue without a grant: cancelled, its wait deadline passed when
    /// the key was handed off, or its session ended. A waiting RPC answers "not granted".
    WaiterDropped {
        /// Session.
        session_id: String,
        /// The `Acquire`'s request id.
        request_id: u64,
        /// Key.
        key: String,
    },
    /// A session was opened.
    SessionOpened {
        /// Session id.
        session_id: String,
        /// Lease length.
        ttl_ms: u64,
        /// The principal the session is bound to (`AsCaller`), `None` for an unbound one. It
        /// never changes, so a node's lease keeper checks a heartbeat's caller against it
        /// without reading the state.
        principal: Option<String>,
    },
    /// A session ended (closed or expired).
    SessionEnded {
        /// Session id.
        session_id: String,
        /// `true` for `ExpireSession` (the reaper found its lease lapsed), `false` for
        /// `CloseSession`. The node's metrics count an expiry apart from a close, and only an
        /// applied event tells every replica alike which one it was.
        expired: bool,
    },
    /// `Promote` restarted every lease at this stamp.
    Promoted {
        /// The promote's stamp.
        stamp_ms: u64,
    },
}
