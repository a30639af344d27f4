//! The force-revoke audit log on etcd: reading it newest first (`RequestStore::revocations`)
//! and keeping it to the newest [`AUDIT_LOG_MAX`] records, as the Raft backend's replicated log
//! is.
//!
//! The records are written by the revoke's own transaction (`revocation/<key>\0<uuid>`, on no
//! lease); this file only reads and trims them. A record's CreateRevision is the revoke's
//! transaction revision, which is its `new_token_floor`: one global counter, so the log's order
//! is etcd's commit order and a later revoke always has a higher floor.
//!
//! A read takes the newest `AUDIT_LOG_MAX` records of every key in one range (one revision, at
//! most `AUDIT_LOG_MAX` small records, well inside a gRPC message) and filters and pages them
//! here, so the bound is exact for every reader whether or not the trim has caught up, and a
//! filtered page never answers a record the unfiltered log no longer holds. `ListRevocations`
//! is an operator's call, not a hot path; one bounded range per page is its whole cost.
//!
//! The trim runs after a revoke commits, outside its transaction, so a revoke never fails or
//! conflicts because of the log's bound; two nodes trimming at once delete the same keys, which
//! is harmless. A trim that fails is retried by the next revoke.

use lock_api::limits::AUDIT_LOG_MAX;
use lock_api::{LockError, RevocationRecord};

use super::layout::{decode, prefix_end};
use super::wire::{RequestOp, TxnRequest};
use super::{EtcdLockStore, RevocationRecord as StoredRevocation, ops, system_time, token_of};

/// Most deletes in one trim transaction: below etcd's default `--max-txn-ops` (128). The trim
/// normally deletes one record (the one the latest revoke pushed out); a longer backlog is
/// worked off by the following revokes.
const TRIM_OPS_MAX_ETCD: i64 = 64;

/// `AUDIT_LOG_MAX` as etcd's `int64` range limit (checked to fit at compile time).
const AUDIT_LOG_MAX_ETCD: i64 = AUDIT_LOG_MAX as i64;
const _: () = assert!(AUDIT_LOG_MAX > 0 && AUDIT_LOG_MAX as u64 <= i64::MAX as u64);

impl EtcdLockStore {
    /// See `RequestStore::revocations`.
    pub(super) async fn read_revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RevocationRecord>, LockError> {
        let start = self.layout.audit_log();
        let end = prefix_end(&start);
        let read = self
            .read_all(
                "reading the audit log",
                vec![ops::range_by_age(start, end, AUDIT_LOG_MAX_ETCD, true)],
            )
            .await?;
        let mut page = Vec::new();
        for kv in &ops::range_result(&read, 0)?.kvs {
            if page.len() >= limit {
                break;
            }
            let floor = token_of(kv.create_revision)?;
            if before_floor.is_some_and(|before| floor >= before) {
                continue;
            }
            let revoked_key = self.layout.parse_revocation(&kv.key).ok_or_else(|| {
                LockError::contention(format!(
                    "etcd audit log: {:?} is not a revocation key",
                    String::from_utf8_lossy(&kv.key)
                ))
            })?;
            if key.is_some_and(|key| key != revoked_key) {
                continue;
            }
            let record: StoredRevocation = decode(&kv.key, &kv.value)?;
            page.push(RevocationRecord {
                key: revoked_key,
                operator: record.operator,
                reason: record.reason,
                previous_owner_id: record.previous_owner_id,
                previous_token: record.previous_token,
                new_token_floor: floor,
                revoked_at: system_time(record.revoked_ms),
                request_id: record.request_id,
            });
        }
        Ok(page)
    }

    /// Deletes the records older than the newest `AUDIT_LOG_MAX`; best effort (see the module
    /// documentation), so a failure is logged, not returned.
    pub(super) async fn trim_revocations(&self) {
        if let Err(e) = self.trim_once().await {
            tracing::warn!(
                error = %e,
                "the etcd audit log was not trimmed to AUDIT_LOG_MAX now; the next revoke trims \
                 it, and no reader sees the extra records"
            );
        }
    }

    /// One trim. The count and the oldest records are read at one revision: the records
    /// beyond the newest `AUDIT_LOG_MAX` *at that revision* are beyond them for ever (later
    /// revokes only add newer ones), so deleting them is right however many nodes trim at once.
    /// Counting and reading the oldest at two revisions would let a trim that another one
    /// overtook delete records inside the bound.
    async fn trim_once(&self) -> Result<(), LockError> {
        let start = self.layout.audit_log();
        let end = prefix_end(&start);
        let read = self
            .read_all(
                "reading the audit log's size and oldest records",
                vec![
                    ops::count(start.clone(), end.clone()),
                    ops::oldest_keys(start, end, TRIM_OPS_MAX_ETCD),
                ],
            )
            .await?;
        let excess = usize::try_from(ops::counted(&read, 0)?)
            .unwrap_or(0)
            .saturating_sub(AUDIT_LOG_MAX);
        if excess == 0 {
            return Ok(());
        }
        let deletes: Vec<RequestOp> = ops::range_result(&read, 1)?
            .kvs
            .iter()
            .take(excess)
            .map(|kv| ops::delete(kv.key.clone()))
            .collect();
        self.txn(
            "trimming the audit log",
            TxnRequest {
                compare: vec![],
                success: deletes,
                failure: vec![],
            },
        )
        .await?;
        Ok(())
    }
}
