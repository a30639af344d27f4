//! Bounds on the replicated lock state, each with the reason it exists.
//!
//! Every grant, waiter, session and remembered answer lives in the memory of every replica, in
//! every snapshot and (through the commands that made it) in the Raft log, so anything unbounded
//! here is an unbounded cost on every node. Argument bounds (key and owner length, TTL and wait
//! bounds) are `lock_api::limits` and are checked with `lock_api::validate`; this module holds
//! only the bounds the state machine itself adds. It owns constants only, no logic.
//!
//! `apply` does not read these constants: it enforces the limits the table carries
//! ([`ApplyLimits`](crate::ApplyLimits)), which are `ApplyLimits::V1`, a frozen copy of the
//! values below, so that a release that edits a value here cannot make its replicas replay an
//! old log differently from their peers (issue 18).

/// Most waiters queued on one key.
///
/// A queue is FIFO and every hand-off walks it from the front, and each waiter is a slot on
/// every replica. A thousand processes blocking on one key is already a design smell; past that
/// a caller gets `LimitExceeded` and should back off instead of queueing.
pub const WAITERS_PER_KEY_MAX: usize = 1024;

/// Most lock slots one session may use: the grants it holds **plus** the waits it has queued.
///
/// A queued wait reserves a lock slot, so a hand-off can always grant the waiter without
/// breaking this limit (a hand-off never has to refuse a waiter that was already accepted).
/// Closing or expiring a session releases all of them in one apply, so this also bounds the
/// work of one `CloseSession`/`ExpireSession`.
pub const LOCKS_PER_SESSION_MAX: usize = 1024;

/// Most waits one session may have queued at once (across all keys).
///
/// A waiting client holds one server task per wait on the leader; a session that queues on
/// hundreds of keys at once is a bug (a loop without a `max_wait`), not a workload.
pub const WAITS_PER_SESSION_MAX: usize = 32;

/// Most live sessions in the cluster.
///
/// Every session is held in memory on every replica with its request window; 100 000 sessions is
/// well above the fleet the service is sized for (one session per worker process), and
/// bounds a snapshot to a size every replica can hold and ship.
pub const SESSIONS_MAX: usize = 100_000;

/// Force-revoke audit records kept in the replicated state (oldest evicted, never rejected).
///
/// A revoke must always be possible (it is the break-glass path), so a full log evicts its
/// oldest record instead of refusing; the leader also logs each revoke, so the replicated log
/// is the recent history an operator inspects, not the archive.
pub const AUDIT_LOG_MAX: usize = 1024;

/// Answers remembered per session for idempotent retries (D-idempotency).
///
/// One answer per session is not enough (docs/DESIGN.md D-idempotency): one session may have
/// several calls in flight (an acquire waiting on one key while it renews another), and a retry
/// of any of them must find its own answer. 64 is twice [`WAITS_PER_SESSION_MAX`], so a
/// session's queued acquires and as many other calls in flight still find their answers; an
/// older request id is answered `StaleRequest`. The cost is bounded by
/// `SESSIONS_MAX * REQUEST_WINDOW` remembered answers.
pub const REQUEST_WINDOW: usize = 64;

/// Most commands in one `Batch` entry.
///
/// A batch is applied in one step on every replica and written as one log entry; bounding it
/// bounds both the entry size (each command is at most a few KiB) and the time one apply
/// holds the state machine. The leader's proposer must not gather more; a larger batch is
/// rejected element by element.
pub const BATCH_MAX: usize = 512;

const _: () = assert!(WAITS_PER_SESSION_MAX <= LOCKS_PER_SESSION_MAX);
const _: () = assert!(SESSIONS_MAX >= 100_000);
const _: () = assert!(REQUEST_WINDOW >= 2 * WAITS_PER_SESSION_MAX);
const _: () = assert!(WAITERS_PER_KEY_MAX > 0 && AUDIT_LOG_MAX > 0 && BATCH_MAX > 0);

/// How long after a force-revoke a request with the same `(key, operator, request_id)` is taken
/// for its retry and answered the first outcome, in stamp milliseconds.
///
/// Retries of a lost answer come within seconds (a client's call deadline); a minute covers
/// them across a leader failover. Bounding it in time, not only by the audit log's length, means
/// an operator's later break-glass with a reused id is never silently swallowed as a "retry".
pub const REVOKE_RETRY_WINDOW_MS: u64 = 60_000;

// Every backend deduplicates revokes over the same window (lock_api::request_store).
const _: () =
    assert!(REVOKE_RETRY_WINDOW_MS as u128 == lock_api::limits::REVOKE_RETRY_WINDOW.as_millis());
