//! [`Backend`]: the one seam between a node's gRPC services and whatever keeps its lock table
//! (docs/DESIGN.md D-serve).
//!
//! The seam carries what a client sends and nothing of the wire: the request identity
//! `(session_id, request_id)`, the acquire's `max_wait`, cancellation when the caller goes
//! away (its future is dropped), and the owner taken from the session, never from the call.
//! Its records ([`Grant`], [`KeyState`], [`Revocation`], [`AuditRecord`], [`NodeStatus`]) are
//! plain values; no
//! proto type appears here (the gRPC layer converts, in `grpc::convert`).
//!
//! Two implementations:
//! - [`raft`]: the node's own Raft cluster (leader-local leases, replicated waiter queues).
//! - [`stateless`]: any [`lock_api::RequestStore`] — PostgreSQL or etcd — where every node
//!   serves every call and the backend keeps queues and request ids.
//!
//! Every method validates its arguments with `lock_api::validate` before anything reaches the
//! store, in the same order in both implementations, so a bad argument is the same error on
//! every backend. Durations arrive in the client's milliseconds, as sent.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use lock_api::LockError;
use tokio::sync::watch;

mod abandoned;
pub mod raft;
pub mod stateless;

/// A grant as a client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The locked key.
    pub key: String,
    /// The holder's owner id (its session's owner).
    pub owner_id: String,
    /// The holder's session.
    pub session_id: String,
    /// The fencing token.
    pub token: u64,
    /// The lease length the grant was made or renewed with.
    pub ttl_ms: u64,
    /// The backend's wall-clock expiry, informational only (C2 D3).
    pub expires_at_ms: u64,
}

/// The current grant of a key and its queue, as `inspect` answers. Not a [`Grant`]: the lease
/// length is not part of what `inspect` answers (no backend's read reports it), while when the
/// grant was made is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyState {
    /// The key.
    pub key: String,
    /// The holder's owner id.
    pub owner_id: String,
    /// The holder's session.
    pub session_id: String,
    /// The grant's fencing token.
    pub token: u64,
    /// When the grant was made (the backend's wall clock, display only).
    pub acquired_at_ms: u64,
    /// The best-known expiry (the backend's wall clock, display only).
    pub expires_at_ms: u64,
    /// Acquires queued for the key.
    pub waiter_count: u32,
}

/// The outcome of a force-revoke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocation {
    /// The key.
    pub key: String,
    /// The displaced holder's owner id, if the key was held.
    pub previous_owner_id: Option<String>,
    /// The displaced grant's token, if the key was held.
    pub previous_token: Option<u64>,
    /// The token floor after the revoke: every later token is greater.
    pub new_token_floor: u64,
}

/// One force-revoke as the audit log keeps it (`AdminService.ListRevocations`). Every backend
/// keeps the newest [`lock_api::limits::AUDIT_LOG_MAX`] of them, ordered by `new_token_floor`
/// (unique per revoke, higher for a later one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    /// The revoked key.
    pub key: String,
    /// Who revoked.
    pub operator: String,
    /// Why.
    pub reason: String,
    /// The displaced holder's owner id, if the key was held.
    pub previous_owner_id: Option<String>,
    /// The displaced grant's token, if the key was held.
    pub previous_token: Option<u64>,
    /// The token floor the revoke set.
    pub new_token_floor: u64,
    /// When the backend applied it, wall-clock ms since the epoch (display only).
    pub revoked_at_ms: u64,
    /// The revoke's request id (0: none).
    pub request_id: u64,
}

/// A node's role in its cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Leads (a stateless node always reports this: it serves every call).
    Leader,
    /// Standing for election.
    Candidate,
    /// Follows a leader.
    Follower,
    /// Receives the log without voting.
    Learner,
    /// Stopping.
    Shutdown,
}

/// One member of the cluster as this node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Node id.
    pub node_id: u64,
    /// Its advertised `host:port`.
    pub addr: String,
    /// Whether it votes.
    pub voter: bool,
}

/// This node's view of its cluster (`AdminService.Status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// This node's id.
    pub node_id: u64,
    /// Its role.
    pub role: Role,
    /// The current term (0 where there are none).
    pub current_term: u64,
    /// The leader this node knows of.
    pub leader_id: Option<u64>,
    /// The leader's address, empty if unknown.
    pub leader_addr: String,
    /// The index this node knows to be committed.
    pub commit_index: u64,
    /// The index applied to this node's state.
    pub applied_index: u64,
    /// The last index in this node's log.
    pub last_log_index: u64,
    /// The members.
    pub members: Vec<Member>,
    /// Whether the cluster is initialised (a membership is recorded).
    pub initialized: bool,
}

/// What a node's lock, session and admin services need from the lock table behind them.
/// Cheap to clone; every clone is the same backend.
///
/// # Sessions belong to principals
///
/// Every method that opens or presents a session takes `caller`: the principal of the call
/// (the authorization layer's [`Caller`](crate::peer::Caller)), `None` on an `--insecure` node.
/// A session opened with a caller is bound to it, and every later call presenting that
/// session, or a grant of it, with another caller is refused
/// `PermissionDenied { required_role: SESSION_OWNER_ROLE }` before it changes or answers
/// anything (`lock_api::validate::session_principal`, docs/SECURITY.md §3). Each
/// implementation makes the check where it is airtight: the Raft backend in the state machine
/// at apply, and for its leader-local calls against the applied state or, for heartbeats, the
/// lease keeper's record of the session (which carries the principal its applied opening
/// bound); a stateless one against the store, whose record of a session's principal never
/// changes.
pub trait Backend: Clone + Send + Sync + 'static {
    /// Opens a session for `owner_id` with a lease of `ttl_ms`; returns its id and the TTL the
    /// backend keeps, which every heartbeat renews it by.
    fn open_session(
        &self,
        caller: Option<&str>,
        owner_id: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<(String, u64), LockError>> + Send;

    /// Restarts a session's lease. `Ok(Some(ttl_ms))`: alive with that TTL; `Ok(None)` is
    /// terminal: the session and its locks are gone.
    fn keep_alive(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> impl Future<Output = Result<Option<u64>, LockError>> + Send;

    /// [`Backend::keep_alive`] for many sessions; each answer is its session's own (a
    /// malformed id is its own `InvalidArgument`). The whole call fails only as one
    /// `keep_alive` fails for a reason that is not the session's (not the leader, no quorum).
    /// The caller bounds the batch (`lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX`).
    fn keep_alive_batch(
        &self,
        caller: Option<&str>,
        session_ids: &[String],
    ) -> impl Future<Output = Result<Vec<Result<Option<u64>, LockError>>, LockError>> + Send;

    /// Closes a session, releasing its grants; returns how many (0 if it was already gone).
    fn close_session(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> impl Future<Output = Result<u32, LockError>> + Send;

    /// The keys a session holds (empty for a session that is gone).
    fn locks_of(
        &self,
        caller: Option<&str>,
        session_id: &str,
    ) -> impl Future<Output = Result<BTreeSet<String>, LockError>> + Send;

    /// Single-shot acquire: `Ok(None)` if the key is held (or others wait for it).
    fn try_acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Option<Grant>, LockError>> + Send;

    /// Acquires `key`, waiting server-side up to `max_wait_ms` in the key's FIFO queue
    /// (D-wait): `Ok(Some)` once granted, `Ok(None)` if the wait ran out. Dropping the future
    /// while it waits (the caller went away) withdraws the request and releases a grant that
    /// raced the withdrawal.
    fn acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl_ms: u64,
        max_wait_ms: u64,
    ) -> impl Future<Output = Result<Option<Grant>, LockError>> + Send;

    /// Withdraws a waiting acquire; a grant it already received is released. Returns whether a
    /// grant was released.
    fn cancel_acquire(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Renews grant `(key, token)` for `ttl_ms` from now. `Ok(None)` means lost now
    /// (terminal).
    fn renew(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        token: u64,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Option<Grant>, LockError>> + Send;

    /// Compare-and-delete of grant `(key, token)`; `Ok(false)` if it was already gone.
    fn release(
        &self,
        caller: Option<&str>,
        session_id: &str,
        request_id: u64,
        key: &str,
        token: u64,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// The current grant of `key` (advisory). `leader_confirmed` asks for a read no older than
    /// the call, where the backend can serve a stale one otherwise.
    fn inspect(
        &self,
        key: &str,
        leader_confirmed: bool,
    ) -> impl Future<Output = Result<Option<KeyState>, LockError>> + Send;

    /// Break-glass revoke of `key`'s grant, advancing the token floor (FR-08). A retry of a
    /// non-zero `request_id` answers the first outcome instead of revoking again.
    fn force_revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> impl Future<Output = Result<Revocation, LockError>> + Send;

    /// The force-revoke audit log, newest first: at most `limit` records, only those whose
    /// floor is below `before_floor` (when given) and only of `key` (when given). A read no
    /// older than the call: a revoke that was answered before it is in the answer (the Raft
    /// backend reads on the leader after confirming its leadership; a follower answers
    /// `NotLeader`). The caller bounds `limit` (`lock_proto::audit::REVOCATIONS_PAGE_SIZE_MAX`).
    fn revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AuditRecord>, LockError>> + Send;

    /// This node's view of its cluster.
    fn status(&self) -> NodeStatus;

    /// Initialises the cluster with `members` (node id → address) as voters.
    fn init(
        &self,
        members: BTreeMap<u64, String>,
    ) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Adds `node_id` at `addr` as a learner, waiting until it has caught up.
    fn add_learner(
        &self,
        node_id: u64,
        addr: String,
    ) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Makes `voters` the voting members; `retain` keeps removed voters as learners.
    fn change_membership(
        &self,
        voters: BTreeSet<u64>,
        retain: bool,
    ) -> impl Future<Output = Result<(), LockError>> + Send;

    /// `true` while this node can serve client calls (the health service reports it).
    fn serving(&self) -> watch::Receiver<bool>;

    /// Turns `true` when the node starts shutting down: waiting acquires stop waiting, open
    /// pipelines read no new call.
    fn stop_signal(&self) -> watch::Receiver<bool>;
}
