//! [`PgLockStore`]: `lock_api::LockStore` + `lock_api::SessionRegistry` (C2 §2.5,
//! "dev.lock.server.store.pg") and `lock_api::RequestStore` over PostgreSQL, behind cargo
//! feature `pg`.
//!
//! Owns the schema and its embedded versioned migrations — version 1 is C2's (`lock_entry` with
//! `lock_entry_expiry_idx` and `lock_entry_session_idx`, `fencing_token_seq`, `lock_revocation`,
//! `lock_session`), version 2 adds what clients meet on every backend (`lock_waiter`,
//! `lock_request`, `lock_session.request_floor`, `lock_revocation.request_id`), version 3 the
//! principal that opened each session, version 4 the indexes that read the audit log newest first — and the SQL of
//! each method. Holds no lock state itself: every node that points at the same database serves
//! the same lock table. Must not decide anything from its own clock — the database's `now()` is
//! the one clock for expiry and wait deadlines — and must never report a driver failure
//! (serialization failure, lock or pool timeout, lost connection) as "lost": those are
//! `LockError::Contention`.
//!
//! # Layout
//!
//! - this file: connecting, migrating, and C2's methods;
//! - `pg/requests.rs`: `RequestStore`, and the revoke, session-ending and reaping transactions
//!   C2's methods share with it;
//! - `pg/queue.rs`: the steps inside those transactions (key lock, lapsed waiters, hand-off,
//!   ending a session, `NOTIFY`);
//! - `pg/listen.rs`: the `LISTEN` connection and the registry of local waiters;
//! - `pg/audit.rs`: reading the revocation audit log and keeping it to `AUDIT_LOG_MAX` rows.
//!
//! # Token order
//!
//! Every grant and every revoke of a key first takes a transaction-scoped advisory lock on that
//! key and only then calls `nextval('fencing_token_seq')`. Taking `nextval()` before holding the
//! key would let a slow inserter publish a token lower than one already granted and released on
//! the same key — tokens out of grant order under contention (INV-04). The hand-off takes its
//! token the same way, inside the freeing transaction that already holds the key.
//!
//! # The queue and the hand-off (docs/DESIGN.md D-wait)
//!
//! `lock_waiter` is each key's FIFO queue, ordered by `waiter_id` (a `bigserial` drawn under the
//! key's lock, so arrival order), with the wait's deadline and the session it cascades with.
//! Everything that frees a key — `release_request`, `delete_if_owner`, `revoke(_request)`,
//! `cancel_request` with release, `close_session`, a heartbeat that finds its session dead,
//! and `reap_expired` (expired grants, expired sessions) — grants it to the first live waiter
//! (deadline not passed, session alive) **in the same transaction**, skipping and dropping the
//! dead ones, and records the grant in `lock_request`. A new acquire or `try_insert` that finds
//! the key free but its queue not empty (a lease that ran out before the reaper came) makes that
//! hand-off first, so it never overtakes a waiter. Waiters whose deadline passed are dropped by
//! the reaper, by any transaction on their key, and by their own `wait_for_grant` at the
//! deadline. Lock order is always key(s) first — several in lock-id order — then the session row.
//!
//! # Notifications
//!
//! Every change of a waited request's state (granted, dropped, withdrawn, its session ended)
//! `NOTIFY`s channel `lockd_request` in the changing transaction, so it is delivered at commit.
//! One `LISTEN` connection per store (`pg/listen.rs`) wakes this process's local waiters, which
//! then read the state; on every (re)connect all of them read again, since notifications sent
//! while nothing listened are lost. No waiter polls.
//!
//! # The request table (docs/DESIGN.md D-idempotency)
//!
//! `lock_request` holds `(session_id, request_id)` → the answer of each acquire (granted with
//! its grant, queued, not granted, or a cancel's tombstone), each release (released or not) and
//! of a cancel of the same id, written in the effect's transaction and deleted with the session.
//! A retry is answered from it. `reap_expired` forgets rows older than
//! `lock_api::limits::REQUEST_RETENTION` and raises the session's `request_floor` past them: an
//! unremembered id at or below it is answered `Contention` ("unknown outcome"), never guessed.
//! Revokes are deduplicated by `(key, operator, request_id)` within
//! `lock_api::limits::REVOKE_RETRY_WINDOW` through `lock_revocation.request_id`.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use lock_api::{
    LockError, LockHandle, LockInfo, LockOutcome, LockStore, RequestStore, SessionRegistry,
    validate,
};
use tokio_postgres::NoTls;

mod audit;
mod listen;
mod queue;
mod requests;

pub use requests::REAP_BATCH_MAX;

pub use listen::{
    LISTEN_APPLICATION_NAME, LISTEN_BACKOFF_MAX, LISTEN_BACKOFF_MIN, LISTEN_CONNECT_TIMEOUT,
    LISTEN_KEEPALIVE_IDLE,
};

/// Connections in the pool: enough for a node's concurrent calls on a 2-core machine without
/// exhausting a default PostgreSQL (`max_connections = 100`) when several nodes share it.
pub const POOL_SIZE_MAX: usize = 16;

/// How long a call waits for a pooled connection before answering `Contention`.
pub const POOL_WAIT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a statement waits for a row or advisory lock (C2: "must never block on a row lock
/// longer than the call deadline"); past it PostgreSQL cancels the wait and we answer
/// `Contention`.
pub const LOCK_WAIT_TIMEOUT_MS: u64 = 2_000;

/// The longest any statement may run before PostgreSQL cancels it (then `Contention`).
pub const STATEMENT_TIMEOUT_MS: u64 = 5_000;

/// Advisory-lock namespace of the migrations, so concurrent nodes migrate one at a time.
const MIGRATION_LOCK_ID: i64 = 0x6c6f_636b_645f_6d31; // "lockd_m1"

/// Seed of `hashtextextended` for the per-key advisory lock that orders grants of a key.
const KEY_LOCK_SEED: i64 = 8;

/// The schema, one entry per version, applied in order and recorded in
/// `lockd_schema_migrations`. Never edit a released entry: add a new version.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("pg/0001_schema.sql")),
    (2, include_str!("pg/0002_requests.sql")),
    (3, include_str!("pg/0003_session_principal.sql")),
    (4, include_str!("pg/0004_audit.sql")),
];

/// The lock table in PostgreSQL. Cheap to clone (the pool and the `LISTEN` connection are
/// shared; the connection's task ends with the last clone).
#[derive(Clone)]
pub struct PgLockStore {
    pool: Pool,
    listener: Arc<listen::Listener>,
}

impl std::fmt::Debug for PgLockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLockStore")
            .field("pool", &self.pool.status())
            .field("listen_pid", &self.listener.pid())
            .finish()
    }
}

/// A request id as stored: the id XOR 2^63, so that SQL's signed `bigint` order is the ids'
/// unsigned order (0002_requests.sql) and every `u64` fits.
pub(crate) fn request_id_sql(request_id: u64) -> i64 {
    (request_id ^ (1 << 63)) as i64
}

/// The inverse of [`request_id_sql`].
pub(crate) fn request_id_of_sql(stored: i64) -> u64 {
    (stored as u64) ^ (1 << 63)
}

/// Any driver or pool failure: retry-safe, never "lost" (C2 §2.5). The message names the
/// operation and carries the whole cause chain (the driver's own `Display` says only "db error").
fn contention(what: &str, e: impl std::fmt::Display + std::fmt::Debug) -> LockError {
    LockError::contention(format!("postgres {what}: {e}: {e:?}"))
}

fn unknown_session(session_id: &str) -> LockError {
    LockError::invalid(format!(
        "session_id: unknown or expired session {session_id:?}"
    ))
}

/// A TTL as the `bigint` milliseconds the SQL multiplies into an interval.
fn ttl_ms_sql(ttl: Duration) -> Result<i64, LockError> {
    let ms = validate::ttl(ttl)?;
    i64::try_from(ms).map_err(|_| LockError::invalid(format!("ttl: {ms} ms does not fit")))
}

/// A token from a `bigint` column; the sequence starts at 1, so anything else is corruption.
fn token_of(raw: i64) -> Result<u64, LockError> {
    u64::try_from(raw).ok().filter(|t| *t > 0).ok_or_else(|| {
        contention(
            "fencing token",
            format!("non-positive token {raw} in lock_entry"),
        )
    })
}

fn token_sql(token: u64) -> Result<i64, LockError> {
    validate::fencing_token(token)?;
    i64::try_from(token)
        .map_err(|_| LockError::invalid(format!("fencing_token: {token} is out of range")))
}

/// A client deadline for a grant made at or after `started`: a server expiry is never later
/// than `started + ttl` as seen by this process, so the local deadline is safe (FR-11).
fn handle(
    key: &str,
    owner_id: String,
    session_id: String,
    token: u64,
    ttl: Duration,
    started: Instant,
    expires_at: SystemTime,
) -> LockHandle {
    LockHandle {
        key: key.to_owned(),
        owner_id,
        session_id,
        fencing_token: token,
        ttl,
        client_deadline: started + ttl,
        server_expiry: expires_at,
    }
}

impl PgLockStore {
    /// Connects to `url` (a libpq-style URL or key=value string), builds the pool and applies
    /// any missing migrations. Fails naming what failed.
    pub async fn connect(url: &str) -> Result<PgLockStore, LockError> {
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| LockError::invalid(format!("postgres url: {e}")))?;
        let options = format!(
            "{} -c lock_timeout={LOCK_WAIT_TIMEOUT_MS} -c statement_timeout={STATEMENT_TIMEOUT_MS}",
            config.get_options().unwrap_or("")
        );
        config.options(options.trim());
        let listener = Arc::new(listen::Listener::start(config.clone()));
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE_MAX)
            .wait_timeout(Some(POOL_WAIT_TIMEOUT))
            .create_timeout(Some(POOL_WAIT_TIMEOUT))
            .recycle_timeout(Some(POOL_WAIT_TIMEOUT))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| contention("building the pool", e))?;
        let store = PgLockStore { pool, listener };
        store.migrate().await?;
        Ok(store)
    }

    /// The backend pid of this store's `LISTEN` connection while it listens, `None` while it is
    /// (re)connecting: for an operator matching it in `pg_stat_activity` (its
    /// `application_name` is [`LISTEN_APPLICATION_NAME`]).
    pub fn listen_pid(&self) -> Option<i32> {
        self.listener.pid()
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, LockError> {
        self.pool
            .get()
            .await
            .map_err(|e| contention("getting a pooled connection", e))
    }

    /// Applies every migration newer than the database's version, in one transaction, under an
    /// advisory lock so that nodes starting together migrate once.
    async fn migrate(&self) -> Result<(), LockError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| contention("migration begin", e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_ID])
            .await
            .map_err(|e| contention("migration lock", e))?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS lockd_schema_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .map_err(|e| contention("creating lockd_schema_migrations", e))?;
        let current: i32 = tx
            .query_one(
                "SELECT coalesce(max(version), 0) FROM lockd_schema_migrations",
                &[],
            )
            .await
            .map_err(|e| contention("reading the schema version", e))?
            .get(0);
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.batch_execute(sql)
                .await
                .map_err(|e| contention(&format!("migration {version}"), e))?;
            tx.execute(
                "INSERT INTO lockd_schema_migrations (version) VALUES ($1)",
                &[version],
            )
            .await
            .map_err(|e| contention(&format!("recording migration {version}"), e))?;
            tracing::info!(version, "applied postgres migration");
        }
        tx.commit()
            .await
            .map_err(|e| contention("migration commit", e))
    }
}

impl LockStore for PgLockStore {
    /// The grant carries the session's owner; `owner_id` must be valid but is not compared
    /// (as in the Raft store).
    async fn try_insert(
        &self,
        key: &str,
        owner_id: &str,
        session_id: &str,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::key(key)?;
        validate::owner_id(owner_id)?;
        validate::session_id(session_id)?;
        let ttl_ms = ttl_ms_sql(ttl)?;
        let started = Instant::now();
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| contention("try_insert begin", e))?;
        // Hold the key before taking a token: token order is grant order (module doc).
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
            &[&key, &KEY_LOCK_SEED],
        )
        .await
        .map_err(|e| contention("try_insert key lock", e))?;
        let owner: String = match tx
            .query_opt(
                "SELECT owner_id FROM lock_session WHERE session_id = $1 AND expires_at > now()",
                &[&session_id],
            )
            .await
            .map_err(|e| contention("try_insert session", e))?
        {
            Some(row) => row.get(0),
            None => return Err(unknown_session(session_id)),
        };
        // An expired grant, or one whose session expired, is already gone (C2: reaping is
        // liveness only). A key freed that way that has live waiters is theirs, not this
        // caller's (FIFO, lock_api::request_store): the hand-off grants it to the first of them
        // and the insert below then finds the key held.
        queue::drop_lapsed(&tx, key, None).await?;
        queue::hand_off(&tx, key).await?;
        let row = tx
            .query_opt(
                "INSERT INTO lock_entry
                     (lock_key, owner_id, session_id, fencing_token, ttl_ms, acquired_at, expires_at)
                 VALUES ($1, $2, $3, nextval('fencing_token_seq'), $4, now(),
                         now() + $4::bigint * interval '1 millisecond')
                 ON CONFLICT (lock_key) DO NOTHING
                 RETURNING fencing_token, expires_at",
                &[&key, &owner, &session_id, &ttl_ms],
            )
            .await
            .map_err(|e| contention("try_insert", e))?;
        tx.commit()
            .await
            .map_err(|e| contention("try_insert commit", e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let token = token_of(row.get(0))?;
        Ok(Some(handle(
            key,
            owner,
            session_id.to_owned(),
            token,
            ttl,
            started,
            row.get(1),
        )))
    }

    async fn extend(
        &self,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::key(key)?;
        let token = token_sql(fencing_token)?;
        let ttl_ms = ttl_ms_sql(ttl)?;
        let started = Instant::now();
        let client = self.client().await?;
        let row = client
            .query_opt(
                "UPDATE lock_entry e SET expires_at = now() + $3::bigint * interval '1 millisecond',
                                         ttl_ms = $3
                 WHERE e.lock_key = $1 AND e.fencing_token = $2 AND e.expires_at > now()
                   AND EXISTS (SELECT 1 FROM lock_session s
                               WHERE s.session_id = e.session_id AND s.expires_at > now())
                 RETURNING owner_id, session_id, expires_at",
                &[&key, &token, &ttl_ms],
            )
            .await
            .map_err(|e| contention("extend", e))?;
        Ok(row.map(|row| {
            handle(
                key,
                row.get(0),
                row.get(1),
                fencing_token,
                ttl,
                started,
                row.get(2),
            )
        }))
    }

    /// The key goes to its first live waiter in the same transaction (lock_api::request_store).
    async fn delete_if_owner(&self, key: &str, fencing_token: u64) -> Result<bool, LockError> {
        validate::key(key)?;
        let token = token_sql(fencing_token)?;
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| contention("delete_if_owner begin", e))?;
        queue::lock_key(&tx, key).await?;
        let deleted = tx
            .execute(
                "DELETE FROM lock_entry WHERE lock_key = $1 AND fencing_token = $2",
                &[&key, &token],
            )
            .await
            .map_err(|e| contention("delete_if_owner", e))?;
        if deleted == 1 {
            queue::hand_off(&tx, key).await?;
        }
        tx.commit()
            .await
            .map_err(|e| contention("delete_if_owner commit", e))?;
        Ok(deleted == 1)
    }

    async fn read(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        validate::key(key)?;
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT e.owner_id, e.fencing_token, e.acquired_at, e.expires_at, e.session_id,
                        (SELECT count(*) FROM lock_waiter w JOIN lock_session ws
                             ON ws.session_id = w.session_id
                         WHERE w.lock_key = e.lock_key AND w.deadline >= now()
                           AND ws.expires_at > now())
                 FROM lock_entry e JOIN lock_session s ON s.session_id = e.session_id
                 WHERE e.lock_key = $1 AND e.expires_at > now() AND s.expires_at > now()",
                &[&key],
            )
            .await
            .map_err(|e| contention("read", e))?;
        row.map(|row| {
            Ok(LockInfo {
                key: key.to_owned(),
                owner_id: row.get(0),
                session_id: row.get(4),
                fencing_token: token_of(row.get(1))?,
                acquired_at: row.get(2),
                expires_at: row.get(3),
                // Live waiters only: a lapsed or orphaned one not yet dropped is not waiting.
                waiter_count: u32::try_from(row.get::<_, i64>(5)).unwrap_or(u32::MAX),
            })
        })
        .transpose()
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        self.revoke_with_id(key, operator, reason, 0).await
    }

    /// Deletes grants whose lease, or whose session's lease, ended before `now` (or before the
    /// database's `now()`, if that is earlier: the node's clock may run ahead), ends the
    /// expired sessions, drops waits that ended before `now`, and forgets request answers older
    /// than `lock_api::limits::REQUEST_RETENTION`; every freed key goes to its next waiter in
    /// the transaction that freed it. Each key and each session is its own transaction, so
    /// concurrent runs each delete a row at most once and their counts add up; one run does at
    /// most [`REAP_BATCH_MAX`] of each kind (the rest is the next run's).
    async fn reap_expired(&self, now: SystemTime) -> Result<usize, LockError> {
        self.reap(now).await
    }

    fn backend_id(&self) -> &'static str {
        "pg"
    }
}

impl SessionRegistry for PgLockStore {
    async fn open_session(&self, owner_id: &str, ttl: Duration) -> Result<String, LockError> {
        Ok(self.open_session_with_ttl(owner_id, ttl).await?.0)
    }

    /// `false` (terminal) when the session is unknown or its lease already ended; then its
    /// grants are deleted with it (cascade through `lock_entry_session_idx`). As in the Raft
    /// and etcd stores, the session keeps the TTL it was opened with; `ttl` must be valid but
    /// does not change it (the wire protocol's heartbeat carries none).
    async fn heartbeat(&self, session_id: &str, ttl: Duration) -> Result<bool, LockError> {
        ttl_ms_sql(ttl)?;
        Ok(self.renew_session(session_id).await?.is_some())
    }

    /// Drops the session's waiters, releases its grants (each handed to the key's next waiter)
    /// and deletes it, in one transaction.
    async fn close_session(&self, session_id: &str) -> Result<usize, LockError> {
        validate::session_id(session_id)?;
        let ended = self
            .end_session_now(session_id, queue::EndIf::Always)
            .await?;
        let released = ended.map_or(0, |e| e.live_grants);
        usize::try_from(released).map_err(|e| contention("close_session count", e))
    }

    async fn locks_of(&self, session_id: &str) -> Result<BTreeSet<String>, LockError> {
        validate::session_id(session_id)?;
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT e.lock_key FROM lock_entry e JOIN lock_session s
                     ON s.session_id = e.session_id
                 WHERE e.session_id = $1 AND e.expires_at > now() AND s.expires_at > now()",
                &[&session_id],
            )
            .await
            .map_err(|e| contention("locks_of", e))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}
