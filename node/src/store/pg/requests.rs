//! `lock_api::RequestStore` for [`PgLockStore`]: request-id idempotency, the FIFO queue, the
//! session TTL, and the store's own transactions that end sessions, revoke and reap (shared with
//! the C2 methods in `store::pg`).
//!
//! Every effect and the request-table row that remembers its answer are written in one
//! transaction, under the key's advisory lock (`queue::lock_key`), so a retry either finds the
//! row (and answers from it) or finds that nothing happened. The bounds are the Raft state
//! machine's (`lock_raft_store::limits`), so a client meets the same limits on every backend;
//! here they are `InvalidArgument`, as they change nothing. Must not answer from this process's
//! memory: the registry of local waiters only says when to read the database again.

use std::time::{Duration, Instant, SystemTime};

use lock_api::limits::{REQUEST_RETENTION, REVOKE_RETRY_WINDOW};
use lock_api::{
    Acquired, Cancelled, LockError, LockHandle, LockOutcome, RequestStore, RevocationRecord,
    validate,
};
use lock_raft_store::limits::{LOCKS_PER_SESSION_MAX, WAITERS_PER_KEY_MAX, WAITS_PER_SESSION_MAX};
use tokio_postgres::Transaction;

use super::queue::{self, EndIf, Ended, Holder};
use super::{
    PgLockStore, contention, handle, request_id_sql, token_of, token_sql, ttl_ms_sql,
    unknown_session,
};

/// Most keys (or sessions) one `reap_expired` run handles of each kind: bounds one run's time
/// and its hold on a pooled connection; what is left is the next run's (the reaper is a loop).
pub const REAP_BATCH_MAX: i64 = 1_000;

/// Extra pause past a wait's deadline before a waiter drops its own lapsed wait, so the
/// database's `now()` is past the deadline too when the drop runs (the two clocks are read a
/// round trip apart).
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

/// The shortest pause of a waiter that found its wait lapsed but not yet dropped, so a clock
/// difference can never make it spin.
const DEADLINE_RECHECK_MIN: Duration = Duration::from_millis(50);

/// The columns of a `lock_request` row, `$1` = session id, `$2` = stored request id.
const REQUEST_ROW_SQL: &str = "
    SELECT kind, lock_key, state, fencing_token, ttl_ms, grant_expires_at, cancel,
           (extract(epoch FROM (grant_expires_at - now())) * 1000)::bigint
    FROM lock_request WHERE session_id = $1 AND request_id = $2";

/// A remembered request, as `lock_request` holds it.
#[derive(Debug)]
struct RequestRow {
    kind: String,
    lock_key: String,
    state: String,
    fencing_token: Option<i64>,
    ttl_ms: Option<i64>,
    grant_expires_at: Option<SystemTime>,
    cancel: Option<String>,
    /// What is left of the recorded grant's lease by the database's clock, in ms.
    remaining_ms: Option<i64>,
}

impl RequestRow {
    fn of(row: &tokio_postgres::Row) -> RequestRow {
        RequestRow {
            kind: row.get(0),
            lock_key: row.get(1),
            state: row.get(2),
            fencing_token: row.get(3),
            ttl_ms: row.get(4),
            grant_expires_at: row.get(5),
            cancel: row.get(6),
            remaining_ms: row.get(7),
        }
    }

    /// The grant this acquire received, as a handle for a caller whose call began at
    /// `started`. The client deadline counts only what is left of the lease by the database's
    /// clock, from before this read: never later than the grant's real end (FR-11).
    fn grant(
        &self,
        owner_id: &str,
        session_id: &str,
        started: Instant,
    ) -> Result<LockHandle, LockError> {
        let (Some(token), Some(ttl_ms), Some(expires_at)) =
            (self.fencing_token, self.ttl_ms, self.grant_expires_at)
        else {
            return Err(contention(
                "request row",
                format!("granted request without its grant: {self:?}"),
            ));
        };
        let ttl = Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0));
        let left =
            Duration::from_millis(u64::try_from(self.remaining_ms.unwrap_or(0)).unwrap_or(0));
        Ok(LockHandle {
            key: self.lock_key.clone(),
            owner_id: owner_id.to_owned(),
            session_id: session_id.to_owned(),
            fencing_token: token_of(token)?,
            ttl,
            client_deadline: started + left.min(ttl),
            server_expiry: expires_at,
        })
    }
}

/// Request ids are chosen by the client and never zero (lock_api::request_store).
fn request_id_checked(request_id: u64) -> Result<i64, LockError> {
    if request_id == 0 {
        return Err(LockError::invalid(
            "request_id: 0 is not a request id; ids start at 1",
        ));
    }
    Ok(request_id_sql(request_id))
}

/// A request whose answer was forgotten (older than `REQUEST_RETENTION`): its outcome cannot
/// be told, so it is not guessed at (lock_api::request_store).
fn forgotten(session_id: &str, request_id: u64) -> LockError {
    LockError::contention(format!(
        "unknown outcome: request {request_id} of session {session_id} is older than the \
         answers this backend still remembers; retry with a new request id"
    ))
}

fn limit(what: String) -> LockError {
    LockError::invalid(what)
}

async fn request_row(
    tx: &Transaction<'_>,
    session_id: &str,
    request_id: i64,
) -> Result<Option<RequestRow>, LockError> {
    Ok(tx
        .query_opt(REQUEST_ROW_SQL, &[&session_id, &request_id])
        .await
        .map_err(|e| contention("reading the request", e))?
        .as_ref()
        .map(RequestRow::of))
}

/// The live session's owner and request floor; `None` for an unknown or ended session.
/// `lock_for_update` serializes the session's acquires, which count its slots.
async fn live_session(
    tx: &Transaction<'_>,
    session_id: &str,
    lock_for_update: bool,
) -> Result<Option<(String, i64)>, LockError> {
    let sql = if lock_for_update {
        "SELECT owner_id, request_floor FROM lock_session
         WHERE session_id = $1 AND expires_at > now() FOR NO KEY UPDATE"
    } else {
        "SELECT owner_id, request_floor FROM lock_session
         WHERE session_id = $1 AND expires_at > now()"
    };
    Ok(tx
        .query_opt(sql, &[&session_id])
        .await
        .map_err(|e| contention("reading the session", e))?
        .map(|row| (row.get(0), row.get(1))))
}

impl PgLockStore {
    async fn begin<'a>(
        client: &'a mut deadpool_postgres::Object,
        what: &str,
    ) -> Result<deadpool_postgres::Transaction<'a>, LockError> {
        client
            .transaction()
            .await
            .map_err(|e| contention(&format!("{what} begin"), e))
    }

    /// Ends `session_id` (if `when` allows) in a transaction of its own; see
    /// `queue::end_session`.
    pub(super) async fn end_session_now(
        &self,
        session_id: &str,
        when: EndIf,
    ) -> Result<Option<Ended>, LockError> {
        let mut client = self.client().await?;
        let tx = Self::begin(&mut client, "end_session").await?;
        let ended = queue::end_session(&tx, session_id, when).await?;
        tx.commit()
            .await
            .map_err(|e| contention("end_session commit", e))?;
        Ok(ended)
    }

    /// Renews a live session by its own TTL; `None` if it was not live (then it is ended, with
    /// the cascade, before answering).
    pub(super) async fn renew_session(&self, session_id: &str) -> Result<Option<i64>, LockError> {
        validate::session_id(session_id)?;
        let renewed = {
            let client = self.client().await?;
            client
                .query_opt(
                    "UPDATE lock_session SET expires_at = now() + ttl_ms * interval '1 millisecond'
                     WHERE session_id = $1 AND expires_at > now() RETURNING ttl_ms",
                    &[&session_id],
                )
                .await
                .map_err(|e| contention("heartbeat", e))?
        };
        if let Some(row) = renewed {
            return Ok(Some(row.get(0)));
        }
        self.end_session_now(session_id, EndIf::Always).await?;
        Ok(None)
    }

    /// `revoke` with a request id; 0 is never deduplicated.
    pub(super) async fn revoke_with_id(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> Result<LockOutcome, LockError> {
        validate::key(key)?;
        validate::operator(operator)?;
        validate::reason(reason)?;
        let stored_id = (request_id != 0).then(|| request_id_sql(request_id));
        let window_ms = REVOKE_RETRY_WINDOW.as_millis() as i64;
        let mut client = self.client().await?;
        let tx = Self::begin(&mut client, "revoke").await?;
        queue::lock_key(&tx, key).await?;
        if let Some(id) = stored_id {
            // A retry within the window answers the first outcome: a second revoke would
            // displace the next holder.
            let first = tx
                .query_opt(
                    "SELECT previous_owner_id, previous_token, new_token_floor
                     FROM lock_revocation
                     WHERE lock_key = $1 AND operator = $2 AND request_id = $3
                       AND revoked_at >= now() - $4::bigint * interval '1 millisecond'
                     ORDER BY revocation_id DESC LIMIT 1",
                    &[&key, &operator, &id, &window_ms],
                )
                .await
                .map_err(|e| contention("revoke retry lookup", e))?;
            if let Some(row) = first {
                let previous_token: Option<i64> = row.get(1);
                return Ok(LockOutcome {
                    key: key.to_owned(),
                    revoked: previous_token.is_some(),
                    previous_owner_id: row.get(0),
                    previous_token: previous_token.map(token_of).transpose()?,
                    new_token_floor: token_of(row.get(2))?,
                });
            }
        }
        // Delete, advance the floor, write the audit row and hand the key on, in one
        // transaction (C2 §2.5).
        let previous = tx
            .query_opt(
                "DELETE FROM lock_entry WHERE lock_key = $1 RETURNING owner_id, fencing_token",
                &[&key],
            )
            .await
            .map_err(|e| contention("revoke delete", e))?;
        let floor: i64 = tx
            .query_one("SELECT nextval('fencing_token_seq')", &[])
            .await
            .map_err(|e| contention("revoke floor", e))?
            .get(0);
        let (previous_owner_id, previous_token): (Option<String>, Option<i64>) = match &previous {
            Some(row) => (Some(row.get(0)), Some(row.get(1))),
            None => (None, None),
        };
        tx.execute(
            "INSERT INTO lock_revocation
                 (lock_key, operator, reason, previous_owner_id, previous_token, new_token_floor,
                  request_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &key,
                &operator,
                &reason,
                &previous_owner_id,
                &previous_token,
                &floor,
                &stored_id,
            ],
        )
        .await
        .map_err(|e| contention("revoke audit row", e))?;
        queue::drop_lapsed(&tx, key, None).await?;
        queue::hand_off(&tx, key).await?;
        tx.commit()
            .await
            .map_err(|e| contention("revoke commit", e))?;
        drop(client);
        self.trim_revocations().await;
        Ok(LockOutcome {
            key: key.to_owned(),
            revoked: previous.is_some(),
            previous_owner_id,
            previous_token: previous_token.map(token_of).transpose()?,
            new_token_floor: token_of(floor)?,
        })
    }

    /// `reap_expired`: see its doc in `store::pg`.
    pub(super) async fn reap(&self, now: SystemTime) -> Result<usize, LockError> {
        let mut client = self.client().await?;
        // Never past the database's own clock: a node whose clock runs ahead must not reap a
        // grant the database still holds live (C2: a grant is expired before the reaper runs).
        let now: SystemTime = client
            .query_one("SELECT least($1::timestamptz, now())", &[&now])
            .await
            .map_err(|e| contention("reap_expired clock", e))?
            .get(0);
        let mut reaped: u64 = 0;
        // Grants whose own lease ended.
        let keys: Vec<String> = client
            .query(
                "SELECT lock_key FROM lock_entry WHERE expires_at < $1
                 ORDER BY expires_at LIMIT $2",
                &[&now, &REAP_BATCH_MAX],
            )
            .await
            .map_err(|e| contention("reap_expired scan", e))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        for key in &keys {
            let tx = Self::begin(&mut client, "reap_expired").await?;
            queue::lock_key(&tx, key).await?;
            reaped += tx
                .execute(
                    "DELETE FROM lock_entry WHERE lock_key = $1 AND expires_at < $2",
                    &[key, &now],
                )
                .await
                .map_err(|e| contention("reap_expired", e))?;
            queue::drop_lapsed(&tx, key, None).await?;
            queue::hand_off(&tx, key).await?;
            tx.commit()
                .await
                .map_err(|e| contention("reap_expired commit", e))?;
        }
        // Sessions whose lease ended, with every grant and wait on them.
        let sessions: Vec<String> = client
            .query(
                "SELECT session_id FROM lock_session WHERE expires_at < $1
                 ORDER BY expires_at LIMIT $2",
                &[&now, &REAP_BATCH_MAX],
            )
            .await
            .map_err(|e| contention("reap_expired sessions scan", e))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        for session_id in &sessions {
            let tx = Self::begin(&mut client, "reap_expired session").await?;
            if let Some(ended) =
                queue::end_session(&tx, session_id, EndIf::ExpiredBefore(now)).await?
            {
                reaped += ended.grants;
            }
            tx.commit()
                .await
                .map_err(|e| contention("reap_expired session commit", e))?;
        }
        // Waits whose deadline passed: dropped, their waiters told.
        let lapsed: Vec<String> = client
            .query(
                "SELECT DISTINCT lock_key FROM lock_waiter WHERE deadline < $1 LIMIT $2",
                &[&now, &REAP_BATCH_MAX],
            )
            .await
            .map_err(|e| contention("reap_expired waiters scan", e))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        for key in &lapsed {
            let tx = Self::begin(&mut client, "reap_expired waiters").await?;
            queue::lock_key(&tx, key).await?;
            queue::drop_lapsed(&tx, key, Some(now)).await?;
            queue::hand_off(&tx, key).await?;
            tx.commit()
                .await
                .map_err(|e| contention("reap_expired waiters commit", e))?;
        }
        // Answers past their retention; the session's floor remembers that they were there.
        // The sessions' rows are locked first, skipping busy ones (the next run takes them):
        // deleting the answers first and then waiting for a session's row would wait in a
        // cycle with a transaction ending that session, which holds the row and deletes the
        // same answers by cascade.
        let retention_ms = REQUEST_RETENTION.as_millis() as i64;
        client
            .execute(
                "WITH cutoff AS (SELECT now() - $1::bigint * interval '1 millisecond' AS t),
                 locked AS (
                     SELECT s.session_id FROM lock_session s
                     WHERE s.session_id IN (SELECT r.session_id FROM lock_request r, cutoff
                                            WHERE r.created_at < cutoff.t)
                     ORDER BY s.session_id LIMIT $2
                     FOR NO KEY UPDATE SKIP LOCKED),
                 gone AS (
                     DELETE FROM lock_request r USING locked l, cutoff
                     WHERE r.session_id = l.session_id AND r.created_at < cutoff.t
                       AND r.state <> 'queued'
                     RETURNING r.session_id, r.request_id),
                 floors AS (SELECT session_id, max(request_id) AS m FROM gone GROUP BY session_id)
                 UPDATE lock_session s SET request_floor = greatest(s.request_floor, f.m)
                 FROM floors f WHERE s.session_id = f.session_id",
                &[&retention_ms, &REAP_BATCH_MAX],
            )
            .await
            .map_err(|e| contention("reap_expired forgetting old requests", e))?;
        usize::try_from(reaped).map_err(|e| contention("reap_expired count", e))
    }

    /// Drops the lapsed waits of `key` (a waiter whose own deadline passed does this rather
    /// than wait for the reaper).
    async fn drop_lapsed_now(&self, key: &str) -> Result<(), LockError> {
        let mut client = self.client().await?;
        let tx = Self::begin(&mut client, "dropping lapsed waiters").await?;
        queue::lock_key(&tx, key).await?;
        queue::drop_lapsed(&tx, key, None).await?;
        queue::hand_off(&tx, key).await?;
        tx.commit()
            .await
            .map_err(|e| contention("dropping lapsed waiters commit", e))
    }
}

/// A waited-for request's state, as [`RequestStore::wait_for_grant`] reads it.
enum WaitState {
    Granted(LockHandle),
    Ended,
    /// Still queued; its wait ends in this much (by the database's clock).
    Queued(Duration),
}

impl PgLockStore {
    async fn wait_state(
        &self,
        session_id: &str,
        request_id: i64,
        key: &str,
    ) -> Result<WaitState, LockError> {
        let started = Instant::now();
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT r.kind, r.lock_key, r.state, r.fencing_token, r.ttl_ms,
                        r.grant_expires_at, r.cancel,
                        (extract(epoch FROM (r.grant_expires_at - now())) * 1000)::bigint,
                        s.owner_id,
                        (SELECT (extract(epoch FROM (w.deadline - now())) * 1000)::bigint
                         FROM lock_waiter w
                         WHERE w.session_id = r.session_id AND w.request_id = r.request_id)
                 FROM lock_request r JOIN lock_session s ON s.session_id = r.session_id
                 WHERE r.session_id = $1 AND r.request_id = $2 AND s.expires_at > now()",
                &[&session_id, &request_id],
            )
            .await
            .map_err(|e| contention("wait_for_grant read", e))?;
        // No row: never queued here, or its session ended (the rows go with it).
        let Some(row) = row else {
            return Ok(WaitState::Ended);
        };
        let request = RequestRow::of(&row);
        if request.kind != "acquire" || request.lock_key != key {
            return Err(LockError::invalid(format!(
                "request {} of session {session_id} is no acquire of key {key:?}",
                super::request_id_of_sql(request_id)
            )));
        }
        match request.state.as_str() {
            "granted" => Ok(WaitState::Granted(request.grant(
                &row.get::<_, String>(8),
                session_id,
                started,
            )?)),
            "queued" => match row.get::<_, Option<i64>>(9) {
                Some(ms) => Ok(WaitState::Queued(Duration::from_millis(
                    u64::try_from(ms).unwrap_or(0),
                ))),
                None => Ok(WaitState::Ended),
            },
            _ => Ok(WaitState::Ended),
        }
    }
}

/// How often each node reaps on PostgreSQL: expiry hand-offs (a grant's or a session's lease
/// running out) happen when the reaper runs, so 100 ms keeps them close to the Raft leader's
/// (lease end plus its 100 ms safety margin). An idle reap is one clock query, three index range
/// scans and an empty delete: about 60 cheap statements a second per node.
pub const PG_REAP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl PgLockStore {
    /// Inserts a new session row, bound to `principal` if one is given (docs/SECURITY.md §3).
    async fn insert_session(
        &self,
        owner_id: &str,
        ttl: Duration,
        principal: Option<&str>,
    ) -> Result<(String, Duration), LockError> {
        validate::owner_id(owner_id)?;
        let ttl_ms = ttl_ms_sql(ttl)?;
        let session_id = uuid::Uuid::new_v4().simple().to_string();
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO lock_session (session_id, owner_id, ttl_ms, expires_at, principal)
                 VALUES ($1, $2, $3, now() + $3::bigint * interval '1 millisecond', $4)",
                &[&session_id, &owner_id, &ttl_ms, &principal],
            )
            .await
            .map_err(|e| contention("open_session", e))?;
        Ok((
            session_id,
            Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0)),
        ))
    }
}

impl RequestStore for PgLockStore {
    fn reap_interval(&self) -> std::time::Duration {
        PG_REAP_INTERVAL
    }

    async fn open_session_with_ttl(
        &self,
        owner_id: &str,
        ttl: Duration,
    ) -> Result<(String, Duration), LockError> {
        self.insert_session(owner_id, ttl, None).await
    }

    async fn open_bound_session(
        &self,
        owner_id: &str,
        ttl: Duration,
        principal: &str,
    ) -> Result<(String, Duration), LockError> {
        validate::principal(principal)?;
        self.insert_session(owner_id, ttl, Some(principal)).await
    }

    async fn session_principal(&self, session_id: &str) -> Result<Option<String>, LockError> {
        validate::session_id(session_id)?;
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT principal FROM lock_session WHERE session_id = $1",
                &[&session_id],
            )
            .await
            .map_err(|e| contention("session_principal", e))?;
        match row {
            Some(row) => row
                .try_get::<_, Option<String>>(0)
                .map_err(|e| contention("session_principal", e)),
            None => Ok(None),
        }
    }

    async fn keep_alive(&self, session_id: &str) -> Result<Option<Duration>, LockError> {
        Ok(self
            .renew_session(session_id)
            .await?
            .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }

    async fn acquire_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Acquired, LockError> {
        validate::key(key)?;
        validate::session_id(session_id)?;
        let ttl_ms = ttl_ms_sql(ttl)?;
        let wait_ms = i64::try_from(validate::max_wait(wait)?)
            .map_err(|_| LockError::invalid("max_wait does not fit"))?;
        let rid = request_id_checked(request_id)?;
        let started = Instant::now();
        let mut client = self.client().await?;
        let tx = Self::begin(&mut client, "acquire_request").await?;
        // Key first, then the session row: the lock order of every transaction here
        // (queue::end_session).
        queue::lock_key(&tx, key).await?;
        let Some((owner, floor)) = live_session(&tx, session_id, true).await? else {
            return Err(unknown_session(session_id));
        };
        queue::drop_lapsed(&tx, key, None).await?;
        if let Some(row) = request_row(&tx, session_id, rid).await? {
            // A retry: the first attempt's current state, never a second effect.
            let answer = match (row.kind.as_str(), row.state.as_str()) {
                ("acquire", "granted") => {
                    Acquired::Granted(row.grant(&owner, session_id, started)?)
                }
                ("acquire", "queued") => Acquired::Queued,
                ("acquire", _) => Acquired::NotGranted,
                _ => {
                    return Err(LockError::invalid(format!(
                        "request {request_id} of session {session_id} was a release, not an \
                         acquire"
                    )));
                }
            };
            tx.commit()
                .await
                .map_err(|e| contention("acquire_request commit", e))?;
            return Ok(answer);
        }
        if rid <= floor {
            return Err(forgotten(session_id, request_id));
        }
        let counts = tx
            .query_one(
                "SELECT (SELECT request_id FROM lock_waiter WHERE lock_key = $2 AND session_id = $1),
                        (SELECT count(*) FROM lock_entry WHERE session_id = $1),
                        (SELECT count(*) FROM lock_waiter WHERE session_id = $1),
                        (SELECT count(*) FROM lock_waiter WHERE lock_key = $2)",
                &[&session_id, &key],
            )
            .await
            .map_err(|e| contention("acquire_request counts", e))?;
        if let Some(waiting) = counts.get::<_, Option<i64>>(0) {
            return Err(LockError::invalid(format!(
                "session {session_id} already waits on key {key} (request id {}); cancel that \
                 wait before queueing another",
                super::request_id_of_sql(waiting)
            )));
        }
        let (held, waits, mut queued): (i64, i64, i64) =
            (counts.get(1), counts.get(2), counts.get(3));
        // A free key whose queue is not empty goes to the queue first (a hand-off this store
        // could not make earlier: a lease that ran out before the reaper came). This session
        // does not wait on the key (checked above), so the key cannot go to it here.
        // `Some(true)`: held by this session; `Some(false)`: by another; `None`: free.
        let held_by_self = match queue::hand_off(&tx, key).await? {
            Holder::Held(holder) => Some(holder == session_id),
            Holder::HandedOff(holder) => {
                queued -= 1;
                Some(holder == session_id)
            }
            Holder::Free => None,
        };
        let slots_used = held + waits;
        let (answer, state, grant) = match held_by_self {
            // Not re-entrant: waiting on oneself would end only when one's own lease does.
            Some(true) => (Acquired::NotGranted, "not_granted", None),
            Some(false) if wait_ms == 0 => (Acquired::NotGranted, "not_granted", None),
            _ if slots_used >= LOCKS_PER_SESSION_MAX as i64 => {
                return Err(limit(format!(
                    "session {session_id} holds or waits for {slots_used} locks; the limit \
                     LOCKS_PER_SESSION_MAX is {LOCKS_PER_SESSION_MAX}"
                )));
            }
            None => {
                // Token order: nextval() while holding the key (module docs of store::pg).
                let row = tx
                    .query_one(
                        "INSERT INTO lock_entry (lock_key, owner_id, session_id, fencing_token,
                                                 ttl_ms, acquired_at, expires_at)
                         VALUES ($1, $2, $3, nextval('fencing_token_seq'), $4, now(),
                                 now() + $4::bigint * interval '1 millisecond')
                         RETURNING fencing_token, expires_at",
                        &[&key, &owner, &session_id, &ttl_ms],
                    )
                    .await
                    .map_err(|e| contention("acquire_request grant", e))?;
                let token: i64 = row.get(0);
                let expires_at: SystemTime = row.get(1);
                let h = handle(
                    key,
                    owner.clone(),
                    session_id.to_owned(),
                    token_of(token)?,
                    ttl,
                    started,
                    expires_at,
                );
                (Acquired::Granted(h), "granted", Some((token, expires_at)))
            }
            Some(false) => {
                if waits >= WAITS_PER_SESSION_MAX as i64 {
                    return Err(limit(format!(
                        "session {session_id} waits on {waits} keys; the limit \
                         WAITS_PER_SESSION_MAX is {WAITS_PER_SESSION_MAX}"
                    )));
                }
                if queued >= WAITERS_PER_KEY_MAX as i64 {
                    return Err(limit(format!(
                        "key {key} has {queued} waiters; the limit WAITERS_PER_KEY_MAX is \
                         {WAITERS_PER_KEY_MAX}"
                    )));
                }
                tx.execute(
                    "INSERT INTO lock_waiter (lock_key, session_id, request_id, ttl_ms, deadline)
                     VALUES ($1, $2, $3, $4, now() + $5::bigint * interval '1 millisecond')",
                    &[&key, &session_id, &rid, &ttl_ms, &wait_ms],
                )
                .await
                .map_err(|e| contention("acquire_request queue", e))?;
                (Acquired::Queued, "queued", None)
            }
        };
        tx.execute(
            "INSERT INTO lock_request
                 (session_id, request_id, kind, lock_key, state, fencing_token, ttl_ms,
                  grant_expires_at)
             VALUES ($1, $2, 'acquire', $3, $4, $5, $6, $7)",
            &[
                &session_id,
                &rid,
                &key,
                &state,
                &grant.map(|g| g.0),
                &ttl_ms,
                &grant.map(|g| g.1),
            ],
        )
        .await
        .map_err(|e| contention("acquire_request record", e))?;
        tx.commit()
            .await
            .map_err(|e| contention("acquire_request commit", e))?;
        Ok(answer)
    }

    async fn wait_for_grant(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::key(key)?;
        validate::session_id(session_id)?;
        let rid = request_id_checked(request_id)?;
        // Register before the first read: a hand-off committed after the registration wakes
        // it, one committed before is what the read finds.
        let registration = self.listener.register(session_id, request_id);
        loop {
            match self.wait_state(session_id, rid, key).await? {
                WaitState::Granted(h) => return Ok(Some(h)),
                WaitState::Ended => return Ok(None),
                WaitState::Queued(left) => {
                    tokio::select! {
                        _ = registration.woken() => {}
                        _ = tokio::time::sleep((left + DEADLINE_SLACK).max(DEADLINE_RECHECK_MIN)) => {
                            // The wait ran out: drop it now rather than at the reaper's next
                            // run, and read the outcome (a hand-off may have come first).
                            self.drop_lapsed_now(key).await?;
                        }
                    }
                }
            }
        }
    }

    async fn cancel_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        release_if_granted: bool,
    ) -> Result<Cancelled, LockError> {
        validate::key(key)?;
        validate::session_id(session_id)?;
        let rid = request_id_checked(request_id)?;
        let started = Instant::now();
        let nothing = Cancelled {
            grant: None,
            released: false,
        };
        let mut client = self.client().await?;
        let tx = Self::begin(&mut client, "cancel_request").await?;
        // The key's lock orders the cancel against the hand-off: the request is either still
        // queued here (withdrawn) or already granted (kept or released), never both.
        queue::lock_key(&tx, key).await?;
        let Some((owner, floor)) = live_session(&tx, session_id, false).await? else {
            return Ok(nothing);
        };
        queue::drop_lapsed(&tx, key, None).await?;
        let row = request_row(&tx, session_id, rid).await?;
        let (answer, cancel) = match row {
            Some(row) if row.cancel.is_some() => {
                // A retried cancel: its first answer.
                let answer = match row.cancel.as_deref() {
                    Some("kept") => Cancelled {
                        grant: Some(row.grant(&owner, session_id, started)?),
                        released: false,
                    },
                    Some("released") => Cancelled {
                        grant: None,
                        released: true,
                    },
                    _ => nothing,
                };
                return Ok(answer);
            }
            Some(row) if row.kind == "acquire" && row.state == "queued" => {
                if row.lock_key != key {
                    return Err(LockError::invalid(format!(
                        "acquire {request_id} of session {session_id} waits on key {}, not \
                         {key}",
                        row.lock_key
                    )));
                }
                tx.execute(
                    "DELETE FROM lock_waiter WHERE session_id = $1 AND request_id = $2",
                    &[&session_id, &rid],
                )
                .await
                .map_err(|e| contention("cancel_request withdraw", e))?;
                tx.execute(
                    "UPDATE lock_request SET state = 'not_granted'
                     WHERE session_id = $1 AND request_id = $2",
                    &[&session_id, &rid],
                )
                .await
                .map_err(|e| contention("cancel_request settle", e))?;
                queue::notify(&tx, session_id, rid).await?;
                (nothing.clone(), "withdrawn")
            }
            Some(row) if row.kind == "acquire" && row.state == "granted" => {
                let token = row.fencing_token;
                let live = tx
                    .query_opt(
                        "SELECT 1 FROM lock_entry WHERE lock_key = $1 AND fencing_token = $2",
                        &[&row.lock_key, &token],
                    )
                    .await
                    .map_err(|e| contention("cancel_request grant", e))?
                    .is_some();
                if live && row.lock_key != key {
                    return Err(LockError::invalid(format!(
                        "acquire {request_id} of session {session_id} holds key {}, not {key}",
                        row.lock_key
                    )));
                }
                match (live, release_if_granted) {
                    (false, _) => (nothing.clone(), "nothing"),
                    (true, true) => {
                        tx.execute(
                            "DELETE FROM lock_entry WHERE lock_key = $1 AND fencing_token = $2",
                            &[&key, &token],
                        )
                        .await
                        .map_err(|e| contention("cancel_request release", e))?;
                        queue::hand_off(&tx, key).await?;
                        (
                            Cancelled {
                                grant: None,
                                released: true,
                            },
                            "released",
                        )
                    }
                    (true, false) => (
                        Cancelled {
                            grant: Some(row.grant(&owner, session_id, started)?),
                            released: false,
                        },
                        "kept",
                    ),
                }
            }
            Some(_) => (nothing.clone(), "nothing"),
            None => {
                if rid <= floor {
                    return Err(forgotten(session_id, request_id));
                }
                // A tombstone: the acquire of this id, if it reaches the database after its
                // cancel, finds it and does nothing.
                tx.execute(
                    "INSERT INTO lock_request (session_id, request_id, kind, lock_key, state)
                     VALUES ($1, $2, 'acquire', $3, 'cancelled')",
                    &[&session_id, &rid, &key],
                )
                .await
                .map_err(|e| contention("cancel_request tombstone", e))?;
                (nothing.clone(), "nothing")
            }
        };
        tx.execute(
            "UPDATE lock_request SET cancel = $3 WHERE session_id = $1 AND request_id = $2",
            &[&session_id, &rid, &cancel],
        )
        .await
        .map_err(|e| contention("cancel_request record", e))?;
        tx.commit()
            .await
            .map_err(|e| contention("cancel_request commit", e))?;
        Ok(answer)
    }

    async fn release_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        fencing_token: u64,
    ) -> Result<bool, LockError> {
        validate::key(key)?;
        validate::session_id(session_id)?;
        let token = token_sql(fencing_token)?;
        let rid = request_id_checked(request_id)?;
        let mut client = self.client().await?;
        let tx = Self::begin(&mut client, "release_request").await?;
        queue::lock_key(&tx, key).await?;
        // A session that ended took its grants with it.
        let Some((_, floor)) = live_session(&tx, session_id, false).await? else {
            return Ok(false);
        };
        if let Some(row) = request_row(&tx, session_id, rid).await? {
            if row.kind != "release" {
                return Err(LockError::invalid(format!(
                    "request {request_id} of session {session_id} was an acquire, not a release"
                )));
            }
            // A retry: the first answer, and never a delete of a later grant.
            return Ok(row.state == "released");
        }
        if rid <= floor {
            return Err(forgotten(session_id, request_id));
        }
        // Compare-and-delete on (key, token) and nothing else (C2 §2.5).
        let released = tx
            .execute(
                "DELETE FROM lock_entry WHERE lock_key = $1 AND fencing_token = $2",
                &[&key, &token],
            )
            .await
            .map_err(|e| contention("release_request", e))?
            == 1;
        if released {
            queue::drop_lapsed(&tx, key, None).await?;
            queue::hand_off(&tx, key).await?;
        }
        tx.execute(
            "INSERT INTO lock_request (session_id, request_id, kind, lock_key, state,
                                       fencing_token)
             VALUES ($1, $2, 'release', $3, $4, $5)",
            &[
                &session_id,
                &rid,
                &key,
                &if released { "released" } else { "not_released" },
                &token,
            ],
        )
        .await
        .map_err(|e| contention("release_request record", e))?;
        tx.commit()
            .await
            .map_err(|e| contention("release_request commit", e))?;
        Ok(released)
    }

    async fn revoke_request(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> Result<LockOutcome, LockError> {
        self.revoke_with_id(key, operator, reason, request_id).await
    }

    /// The newest `AUDIT_LOG_MAX` rows of `lock_revocation`, by floor (`pg/audit.rs`).
    async fn revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RevocationRecord>, LockError> {
        self.read_revocations(key, before_floor, limit).await
    }
}
