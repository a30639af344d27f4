//! The steps every freeing or queueing transaction of the PostgreSQL store shares: the per-key
//! advisory lock, dropping lapsed waiters, the hand-off to a key's first live waiter, ending a
//! session, and the `NOTIFY` that wakes a request's local waiters.
//!
//! Each function runs inside the caller's transaction and never commits: the caller's effect,
//! the hand-off it causes, the request table's record of both and the notification commit
//! together or not at all (`NOTIFY` is delivered only at commit). Every function that touches a
//! key's grant or queue expects the caller to hold that key's advisory lock ([`lock_key`]),
//! which serializes everything that decides who holds or waits for the key. Holds no state.

use std::time::SystemTime;

use lock_api::LockError;
use tokio_postgres::Transaction;

use super::{KEY_LOCK_SEED, contention};

/// The one `LISTEN`/`NOTIFY` channel. A payload names one request:
/// `"<biased request id>:<session id>"` (see [`super::request_id_sql`]).
pub(super) const CHANNEL: &str = "lockd_request";

/// The SQL expression of a notification for the row in scope with columns `request_id` and
/// `session_id`.
macro_rules! notify_sql {
    ($r:literal) => {
        concat!(
            "pg_notify('lockd_request', ",
            $r,
            ".request_id::text || ':' || ",
            $r,
            ".session_id)"
        )
    };
}

/// Takes the transaction-scoped advisory lock of `key`. Token order rests on it: a grant takes
/// `nextval()` only while holding its key (module docs of `store::pg`).
pub(super) async fn lock_key(tx: &Transaction<'_>, key: &str) -> Result<(), LockError> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
        &[&key, &KEY_LOCK_SEED],
    )
    .await
    .map_err(|e| contention("key lock", e))?;
    Ok(())
}

/// Takes the advisory locks of several keys in the order of their lock ids, so two
/// transactions that each take many (two sessions ending) never wait on each other in a cycle,
/// even when two keys hash to one lock id.
pub(super) async fn lock_keys(tx: &Transaction<'_>, keys: &[String]) -> Result<(), LockError> {
    if keys.is_empty() {
        return Ok(());
    }
    tx.execute(
        "SELECT pg_advisory_xact_lock(h)
         FROM (SELECT DISTINCT hashtextextended(k, $2) AS h FROM unnest($1::text[]) AS k
               ORDER BY h) AS ids",
        &[&keys, &KEY_LOCK_SEED],
    )
    .await
    .map_err(|e| contention("key locks", e))?;
    Ok(())
}

/// Wakes the local waiters of request `(session_id, request_id)` on every node, at commit.
pub(super) async fn notify(
    tx: &Transaction<'_>,
    session_id: &str,
    request_id: i64,
) -> Result<(), LockError> {
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&CHANNEL, &format!("{request_id}:{session_id}")],
    )
    .await
    .map_err(|e| contention("notify", e))?;
    Ok(())
}

/// Drops the waiters of `key` whose wait deadline is before `before` (the database's `now()`
/// when `None`), settles their acquires as `not_granted` and notifies them; returns how many.
/// The caller holds the key's lock.
pub(super) async fn drop_lapsed(
    tx: &Transaction<'_>,
    key: &str,
    before: Option<SystemTime>,
) -> Result<u64, LockError> {
    let dropped = tx
        .execute(
            concat!(
                "WITH dropped AS (
                     DELETE FROM lock_waiter
                     WHERE lock_key = $1 AND deadline < coalesce($2::timestamptz, now())
                     RETURNING session_id, request_id),
                 settled AS (
                     UPDATE lock_request r SET state = 'not_granted'
                     FROM dropped d
                     WHERE r.session_id = d.session_id AND r.request_id = d.request_id
                       AND r.state = 'queued')
                 SELECT ",
                notify_sql!("d"),
                " FROM dropped d"
            ),
            &[&key, &before],
        )
        .await
        .map_err(|e| contention("dropping lapsed waiters", e))?;
    Ok(dropped)
}

/// Who holds a key after [`hand_off`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Holder {
    /// A live grant of this session was already there; nothing changed.
    Held(String),
    /// The key was free and went to this session, its first live waiter.
    HandedOff(String),
    /// The key is free and nobody waits for it.
    Free,
}

/// If `key` has no live grant, grants it to its first live waiter (wait deadline not passed,
/// session alive), dropping and notifying the dead waiters met on the way; records the grant
/// in the request table and notifies its request. The caller holds the key's lock, so the
/// `nextval()` below is taken in grant order (token rule). A dead grant still in the table
/// (expired, not yet reaped) is deleted first: it already ended (C2: reaping is liveness only).
pub(super) async fn hand_off(tx: &Transaction<'_>, key: &str) -> Result<Holder, LockError> {
    // One statement: the outer query sees the table as it was before the CTE's delete, which
    // removes only a dead grant, so a live one is still found.
    let holder = tx
        .query_opt(
            "WITH dead AS (
                 DELETE FROM lock_entry e WHERE e.lock_key = $1
                   AND NOT (e.expires_at > now() AND EXISTS (
                       SELECT 1 FROM lock_session s
                       WHERE s.session_id = e.session_id AND s.expires_at > now())))
             SELECT e.session_id FROM lock_entry e JOIN lock_session s
                 ON s.session_id = e.session_id
             WHERE e.lock_key = $1 AND e.expires_at > now() AND s.expires_at > now()",
            &[&key],
        )
        .await
        .map_err(|e| contention("hand-off holder", e))?;
    if let Some(row) = holder {
        return Ok(Holder::Held(row.get(0)));
    }
    // Bounded by the queue's length: every turn removes one waiter.
    loop {
        let Some(waiter) = tx
            .query_opt(
                "DELETE FROM lock_waiter
                 WHERE waiter_id = (SELECT waiter_id FROM lock_waiter WHERE lock_key = $1
                                    ORDER BY waiter_id LIMIT 1)
                 RETURNING session_id, request_id, ttl_ms, deadline >= now()",
                &[&key],
            )
            .await
            .map_err(|e| contention("hand-off next waiter", e))?
        else {
            return Ok(Holder::Free);
        };
        let session_id: String = waiter.get(0);
        let request_id: i64 = waiter.get(1);
        let ttl_ms: i64 = waiter.get(2);
        let in_time: bool = waiter.get(3);
        let owner = tx
            .query_opt(
                "SELECT owner_id FROM lock_session WHERE session_id = $1 AND expires_at > now()",
                &[&session_id],
            )
            .await
            .map_err(|e| contention("hand-off waiter session", e))?;
        let (Some(owner), true) = (owner, in_time) else {
            tx.execute(
                "UPDATE lock_request SET state = 'not_granted'
                 WHERE session_id = $1 AND request_id = $2 AND state = 'queued'",
                &[&session_id, &request_id],
            )
            .await
            .map_err(|e| contention("hand-off dropping a waiter", e))?;
            notify(tx, &session_id, request_id).await?;
            continue;
        };
        let owner: String = owner.get(0);
        let grant = tx
            .query_one(
                "INSERT INTO lock_entry
                     (lock_key, owner_id, session_id, fencing_token, ttl_ms, acquired_at, expires_at)
                 VALUES ($1, $2, $3, nextval('fencing_token_seq'), $4, now(),
                         now() + $4::bigint * interval '1 millisecond')
                 RETURNING fencing_token, expires_at",
                &[&key, &owner, &session_id, &ttl_ms],
            )
            .await
            .map_err(|e| contention("hand-off grant", e))?;
        let fencing_token: i64 = grant.get(0);
        let expires_at: SystemTime = grant.get(1);
        tx.execute(
            "UPDATE lock_request
             SET state = 'granted', fencing_token = $3, ttl_ms = $4, grant_expires_at = $5
             WHERE session_id = $1 AND request_id = $2",
            &[
                &session_id,
                &request_id,
                &fencing_token,
                &ttl_ms,
                &expires_at,
            ],
        )
        .await
        .map_err(|e| contention("hand-off recording the grant", e))?;
        notify(tx, &session_id, request_id).await?;
        tracing::debug!(
            key,
            session_id,
            fencing_token,
            "handed off to the first waiter"
        );
        return Ok(Holder::HandedOff(session_id));
    }
}

/// When [`end_session`] ends a session.
#[derive(Clone, Copy, Debug)]
pub(super) enum EndIf {
    /// Always (close_session; heartbeat of a session found dead).
    Always,
    /// Only if its lease ended before this instant (the reaper), so a heartbeat that renewed it
    /// in between wins.
    ExpiredBefore(SystemTime),
}

/// What [`end_session`] removed.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Ended {
    /// Grants removed, live or not.
    pub grants: u64,
    /// Grants that were live (grant and session lease not ended) when removed.
    pub live_grants: u64,
}

/// Ends `session_id` if `when` says so: drops its waiters (notified), deletes its grants and
/// the session (with its request rows, by cascade), and hands each freed key to its next
/// waiter. `None` if the session was not there to end (gone, or renewed past `when`).
///
/// Lock order is keys, then the session row, as in `acquire_request`: the keys the session
/// holds or waits on are locked first (in lock-id order); keys it gained between that read and
/// the session's row lock (a hand-off committing in between) are locked after, which can only
/// meet a cycle that PostgreSQL's deadlock detector breaks (then `Contention`, retry-safe).
pub(super) async fn end_session(
    tx: &Transaction<'_>,
    session_id: &str,
    when: EndIf,
) -> Result<Option<Ended>, LockError> {
    let keys_sql = "SELECT lock_key FROM lock_entry WHERE session_id = $1
                    UNION SELECT lock_key FROM lock_waiter WHERE session_id = $1";
    let keys: Vec<String> = tx
        .query(keys_sql, &[&session_id])
        .await
        .map_err(|e| contention("end_session keys", e))?
        .iter()
        .map(|row| row.get(0))
        .collect();
    lock_keys(tx, &keys).await?;
    let before = match when {
        EndIf::Always => None,
        EndIf::ExpiredBefore(t) => Some(t),
    };
    let alive = tx
        .query_opt(
            "SELECT expires_at > now() FROM lock_session
             WHERE session_id = $1 AND ($2::timestamptz IS NULL OR expires_at < $2)
             FOR UPDATE",
            &[&session_id, &before],
        )
        .await
        .map_err(|e| contention("end_session session", e))?;
    let Some(alive) = alive else {
        return Ok(None);
    };
    let alive: bool = alive.get(0);
    let late: Vec<String> = tx
        .query(keys_sql, &[&session_id])
        .await
        .map_err(|e| contention("end_session keys", e))?
        .iter()
        .map(|row| row.get::<_, String>(0))
        .filter(|k| !keys.contains(k))
        .collect();
    lock_keys(tx, &late).await?;
    tx.execute(
        concat!(
            "WITH dropped AS (DELETE FROM lock_waiter WHERE session_id = $1
                              RETURNING session_id, request_id)
             SELECT ",
            notify_sql!("d"),
            " FROM dropped d"
        ),
        &[&session_id],
    )
    .await
    .map_err(|e| contention("end_session waiters", e))?;
    let freed = tx
        .query(
            "DELETE FROM lock_entry WHERE session_id = $1 RETURNING lock_key, expires_at > now()",
            &[&session_id],
        )
        .await
        .map_err(|e| contention("end_session grants", e))?;
    tx.execute(
        "DELETE FROM lock_session WHERE session_id = $1",
        &[&session_id],
    )
    .await
    .map_err(|e| contention("end_session delete", e))?;
    let mut ended = Ended::default();
    for row in &freed {
        ended.grants += 1;
        if alive && row.get::<_, bool>(1) {
            ended.live_grants += 1;
        }
        let key: String = row.get(0);
        hand_off(tx, &key).await?;
    }
    Ok(Some(ended))
}
