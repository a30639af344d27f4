//! The force-revoke audit log on PostgreSQL: reading it newest first
//! (`RequestStore::revocations`) and keeping it to the newest
//! [`AUDIT_LOG_MAX`] rows, as the Raft backend's replicated log is.
//!
//! The rows are written by the revoke's own transaction (`pg/requests.rs`); this file only
//! reads and trims them. The order is `new_token_floor`: drawn from `fencing_token_seq` under
//! the key's advisory lock, it is unique and higher for every later revoke of a key. Of two
//! revokes of *different* keys running at once, the one that drew its floor later may commit
//! first; a client paging at that instant sees the other as it sees any revoke made while it
//! pages (only in a new listing), never twice.
//!
//! The trim runs after a revoke commits, outside its transaction: a revoke must never fail
//! (or wait on another revoke's rows) because of the log's bound. A trim that fails is retried
//! by the next revoke, and the read never answers a row beyond the newest `AUDIT_LOG_MAX`
//! whether or not it was trimmed yet, so the bound holds for every reader either way.

use std::time::SystemTime;

use lock_api::limits::AUDIT_LOG_MAX;
use lock_api::{LockError, RevocationRecord};

use super::{PgLockStore, contention, request_id_of_sql, token_of};

/// `AUDIT_LOG_MAX` as the `bigint` offsets below take it (checked to fit at compile time).
const AUDIT_LOG_MAX_SQL: i64 = AUDIT_LOG_MAX as i64;
const _: () = assert!(AUDIT_LOG_MAX > 0 && AUDIT_LOG_MAX as u64 <= i64::MAX as u64);

/// The floor of the `AUDIT_LOG_MAX`-th newest row: the oldest the log still holds (`$1` is
/// `AUDIT_LOG_MAX`). NULL while the table holds fewer rows.
const OLDEST_KEPT_FLOOR: &str = "(SELECT new_token_floor FROM lock_revocation
      ORDER BY new_token_floor DESC OFFSET $1::bigint - 1 LIMIT 1)";

impl PgLockStore {
    /// See `RequestStore::revocations`.
    pub(super) async fn read_revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RevocationRecord>, LockError> {
        // A floor above i64::MAX is above every stored one: the whole log is below it.
        let before = before_floor.and_then(|f| i64::try_from(f).ok());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT lock_key, operator, reason, previous_owner_id, previous_token,
                            new_token_floor, revoked_at, request_id
                     FROM lock_revocation
                     WHERE ($2::text IS NULL OR lock_key = $2)
                       AND ($3::bigint IS NULL OR new_token_floor < $3)
                       AND new_token_floor >= COALESCE({OLDEST_KEPT_FLOOR}, 0)
                     ORDER BY new_token_floor DESC
                     LIMIT $4::bigint"
                ),
                &[&AUDIT_LOG_MAX_SQL, &key, &before, &limit],
            )
            .await
            .map_err(|e| contention("reading the audit log", e))?;
        rows.iter()
            .map(|row| {
                let previous_token: Option<i64> = row.get(4);
                let request_id: Option<i64> = row.get(7);
                let revoked_at: SystemTime = row.get(6);
                Ok(RevocationRecord {
                    key: row.get(0),
                    operator: row.get(1),
                    reason: row.get(2),
                    previous_owner_id: row.get(3),
                    previous_token: previous_token.map(token_of).transpose()?,
                    new_token_floor: token_of(row.get(5))?,
                    revoked_at,
                    request_id: request_id.map_or(0, request_id_of_sql),
                })
            })
            .collect()
    }

    /// Deletes the rows older than the newest `AUDIT_LOG_MAX`; best effort (see the module
    /// documentation), so a failure is logged, not returned.
    pub(super) async fn trim_revocations(&self) {
        let trimmed = async {
            let client = self.client().await?;
            client
                .execute(
                    &format!(
                        "DELETE FROM lock_revocation WHERE new_token_floor < {OLDEST_KEPT_FLOOR}"
                    ),
                    &[&AUDIT_LOG_MAX_SQL],
                )
                .await
                .map_err(|e| contention("trimming the audit log", e))
        }
        .await;
        if let Err(e) = trimmed {
            tracing::warn!(
                error = %e,
                "the audit log was not trimmed to AUDIT_LOG_MAX now; the next revoke trims it, \
                 and no reader sees the extra rows"
            );
        }
    }
}
