//! Every bound the contract puts on its inputs, each with the reason it exists.
//!
//! "Put a limit on everything" (TigerBeetle's TIGER_STYLE): every key, owner and waiter is
//! copied into every replica's memory and into the Raft log, so an unbounded input is an
//! unbounded cost on every node. Backends may impose tighter limits of their own (the replicated
//! state machine bounds waiters per key and locks per session), never looser ones.

use std::time::Duration;

/// Longest key, in bytes of UTF-8.
///
/// Keys name resources ("payout/2026-11-30", "shard/17"); 256 bytes fits any such name and
/// keeps a grant, which every replica holds in memory and every log entry carries, small.
pub const KEY_LEN_MAX: usize = 256;

/// Longest owner id, in bytes. Owner ids identify a process ("worker-7@host-3"), not a payload.
pub const OWNER_ID_LEN_MAX: usize = 128;

/// Longest session id, in bytes. Servers issue short ids; anything longer is not one of ours.
pub const SESSION_ID_LEN_MAX: usize = 64;

/// Longest operator name on a force-revoke, in bytes (recorded in the audit log).
pub const OPERATOR_LEN_MAX: usize = 128;

/// Longest principal, in bytes: the name a certificate (URI SAN, DNS SAN or CN) or a bearer
/// token gives the caller. A session records its principal in every replica and every log entry
/// of a bound call carries it; 256 bytes fits a SPIFFE id or a DNS name (at most 253). A node
/// refuses a longer one as unauthenticated rather than truncating it, since two names sharing a
/// prefix must never become one principal.
pub const PRINCIPAL_LEN_MAX: usize = 256;

/// Longest revoke reason, in bytes: enough for a sentence and a ticket link, recorded in the
/// bounded audit log of every replica.
pub const REASON_LEN_MAX: usize = 1024;

/// Shortest lease (lock or session TTL).
///
/// A lease must outlive a few round trips plus the client's safety margin, or a holder spends
/// its whole lease renewing; 1 s is also above any sane election timeout, so a failover does not
/// routinely outlast every lease.
pub const TTL_MIN: Duration = Duration::from_secs(1);

/// Longest lease (lock or session TTL).
///
/// A crashed holder blocks its key until the lease runs out; an hour is the longest any operator
/// should wait before the break-glass revoke. Longer critical sections renew (keep-alive).
pub const TTL_MAX: Duration = Duration::from_secs(60 * 60);

/// Longest server-side wait of one `acquire` call.
///
/// A waiter occupies a queue slot on every replica and a server task on the leader; a caller
/// that wants to wait longer calls again, which also re-checks that it still wants the lock.
pub const MAX_WAIT_MAX: Duration = Duration::from_secs(5 * 60);

/// How long a backend remembers a request's answer for a retry, at least (see
/// [`crate::request_store`]): longer than any client keeps retrying one call (the SDK's call
/// budget is seconds), with a wide margin. The Raft backend remembers each session's last 64
/// requests instead, which a client cannot outrun without abandoning the older ones.
pub const REQUEST_RETENTION: Duration = Duration::from_secs(10 * 60);

/// How long after a force-revoke a retry with the same `(key, operator, request_id)` is
/// answered with the first outcome instead of revoking again, on every backend.
pub const REVOKE_RETRY_WINDOW: Duration = Duration::from_secs(60);

/// Force-revoke audit records every backend keeps, the newest; older ones are evicted, never
/// refused.
///
/// A revoke must always be possible (it is the break-glass path), so a full log evicts its
/// oldest record instead of refusing a revoke. The Raft backend keeps the log in the
/// replicated state, in every replica's memory and snapshot, which is what bounds it; the
/// PostgreSQL and etcd backends keep the same number so that every backend answers
/// `ListRevocations` alike. Each revoke is also one log event on the node that served it: the
/// bounded log is the recent history an operator reads, not the archive.
pub const AUDIT_LOG_MAX: usize = 1024;

const _: () = assert!(AUDIT_LOG_MAX > 0);
const _: () = assert!(TTL_MIN.as_millis() < TTL_MAX.as_millis());
const _: () = assert!(KEY_LEN_MAX > 0 && OWNER_ID_LEN_MAX > 0 && SESSION_ID_LEN_MAX > 0);
