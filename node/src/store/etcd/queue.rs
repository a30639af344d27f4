//! The queue of the etcd store: the promote step that hands a free key to its first waiter,
//! dropping waiters whose deadline passed, and the reaper's passes over queues and request
//! records. Owns those transactions only; when to run them is the callers' business (every
//! free runs a promote; waiters run it on a watch event; the reaper as liveness).
//!
//! The promote step is conditional — `lock/<key>` absent and every waiter it read unchanged —
//! so any node may run it at any time, and two nodes running it at once grant once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use lock_api::LockError;
use lock_api::limits::REQUEST_RETENTION;
use lock_proto::etcd::mvccpb::KeyValue;

use super::layout::{Forgotten, RequestRecord, decode, encode, prefix_end};
use super::ops::{self, absent, delete, exists, get, put, unchanged};
use super::wire::{RequestOp, TxnRequest};
use super::{
    Answer, CAS_ROUNDS_MAX, EtcdLockStore, GrantAnswer, GrantRecord, WaiterRecord, no_decision,
    now_ms,
};

/// Lapsed waiters one promote transaction drops at most: each costs three operations and a
/// compare, and etcd refuses a transaction of more than 128 operations (its default
/// `--max-txn-ops`).
pub const DROPS_PER_TXN_MAX: usize = 16;

/// Old request records one transaction of the retention pass deletes at most (one compare and
/// one delete each, within etcd's 128 operations).
pub const FORGETS_PER_TXN_MAX: usize = 64;

/// How often `reap_expired` runs its retention pass over request records: it reads every
/// record, and a record only has to outlive `REQUEST_RETENTION`, not to go at once.
pub const FORGET_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

const _: () = assert!(3 * (DROPS_PER_TXN_MAX + 1) + 5 <= 128);
// Compares: one per record, the session and the mark; operations: one per record and the mark.
const _: () = assert!(FORGETS_PER_TXN_MAX + 2 <= 128);

/// Removes a key from the store's running promotes when dropped.
struct Running<'a> {
    promoting: &'a Mutex<HashMap<String, bool>>,
    key: &'a str,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.promoting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(self.key);
    }
}

impl EtcdLockStore {
    /// The operations that drop waiter `kv` of `session_id` on `key`: its key, its slot, and
    /// its request record rewritten "not granted".
    fn drop_ops(
        &self,
        key: &str,
        session_id: &str,
        kv: &KeyValue,
        waiter: &WaiterRecord,
        now: u64,
    ) -> Result<Vec<RequestOp>, LockError> {
        let record = RequestRecord {
            key: key.to_owned(),
            at_ms: now,
            answer: Answer::NotGranted,
            cancel: None,
        };
        Ok(vec![
            delete(kv.key.clone()),
            delete(self.layout.wait(session_id, key)),
            put(
                self.layout.request(session_id, waiter.request_id),
                encode(&record)?,
                kv.lease,
            ),
        ])
    }

    /// Drops waiter `kv` if it is still the one read; `true` if it did.
    pub(super) async fn drop_waiter(
        &self,
        key: &str,
        session_id: &str,
        kv: &KeyValue,
        waiter: &WaiterRecord,
    ) -> Result<bool, LockError> {
        let resp = self
            .txn(
                "dropping a waiter",
                TxnRequest {
                    compare: vec![unchanged(kv.key.clone(), kv.mod_revision)],
                    success: self.drop_ops(key, session_id, kv, waiter, now_ms())?,
                    failure: vec![],
                },
            )
            .await?;
        Ok(resp.succeeded)
    }

    /// Hands `key` to its first live waiter if the key is free (an expired grant is deleted
    /// first), dropping the lapsed waiters met on the way. Returns once the key is held or its
    /// queue is empty; `Contention` if other writers kept changing it.
    pub(super) async fn promote(&self, key: &str) -> Result<(), LockError> {
        let lock_key = self.layout.lock(key);
        let queue = self.layout.queue(key);
        let queue_end = prefix_end(&queue);
        let mut conflicts = 0;
        while conflicts < CAS_ROUNDS_MAX {
            let read = self
                .read_all(
                    "promote",
                    vec![
                        get(lock_key.clone()),
                        ops::range_by_age(
                            queue.clone(),
                            queue_end.clone(),
                            DROPS_PER_TXN_MAX as i64 + 1,
                            false,
                        ),
                    ],
                )
                .await?;
            let now = now_ms();
            if let Some(kv) = ops::one(&read, 0)? {
                let record: GrantRecord = decode(&kv.key, &kv.value)?;
                if record.expires_ms > now {
                    return Ok(());
                }
                if !self.clear_expired("promote", key, kv, &record).await? {
                    conflicts += 1;
                }
                continue;
            }
            let waiters = &ops::range_result(&read, 1)?.kvs;
            if waiters.is_empty() {
                return Ok(());
            }
            let mut compare = vec![absent(lock_key.clone())];
            let mut success = Vec::new();
            let mut granted = false;
            for w in waiters {
                let waiter: WaiterRecord = decode(&w.key, &w.value)?;
                let Some((_, session_id)) = self.layout.parse_waiter(&w.key) else {
                    return Err(super::contention(
                        "promote",
                        format!("unparsable waiter key {}", String::from_utf8_lossy(&w.key)),
                    ));
                };
                // Every waiter acted on must be the one read: a waiter key that still exists
                // also proves its session's lease is alive, so the puts on it below cannot
                // fail for a lease that ended (etcd deletes a lease's keys in the step that
                // ends it).
                compare.push(unchanged(w.key.clone(), w.mod_revision));
                if waiter.deadline_ms < now {
                    success.extend(self.drop_ops(key, &session_id, w, &waiter, now)?);
                    continue;
                }
                let expires_ms = now.saturating_add(waiter.ttl_ms);
                let grant = GrantRecord {
                    owner_id: waiter.owner_id.clone(),
                    session_id: session_id.clone(),
                    acquired_ms: now,
                    expires_ms,
                };
                let answer = RequestRecord {
                    key: key.to_owned(),
                    at_ms: now,
                    answer: Answer::Granted(GrantAnswer {
                        token: 0,
                        owner_id: waiter.owner_id.clone(),
                        ttl_ms: waiter.ttl_ms,
                        expires_ms,
                    }),
                    cancel: None,
                };
                success.extend(self.grant_ops(key, &grant, w.lease)?);
                success.push(delete(w.key.clone()));
                success.push(delete(self.layout.wait(&session_id, key)));
                success.push(put(
                    self.layout.request(&session_id, waiter.request_id),
                    encode(&answer)?,
                    w.lease,
                ));
                granted = true;
                break;
            }
            let resp = self
                .txn(
                    "promote",
                    TxnRequest {
                        compare,
                        success,
                        failure: vec![],
                    },
                )
                .await?;
            if !resp.succeeded {
                conflicts += 1;
                continue;
            }
            if granted || waiters.len() <= DROPS_PER_TXN_MAX {
                // Granted, or every waiter there was is dropped.
                return Ok(());
            }
            // Dropped a full read of lapsed waiters: more may follow.
        }
        Err(no_decision("promote"))
    }

    /// [`EtcdLockStore::promote`] for a key freed under this store's waiters: every local
    /// waiter of the key sees the same delete, and one promote step of the store serves them
    /// all. A call while one runs on the key returns at once and makes the running one go
    /// again when it is done (its read may predate the free that woke this caller), so no free
    /// goes unpromoted; the caller keeps watching and learns the outcome from its events.
    pub(super) async fn promote_coalesced(&self, key: &str) -> Result<(), LockError> {
        {
            let mut running = self.promoting.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(again) = running.get_mut(key) {
                *again = true;
                return Ok(());
            }
            running.insert(key.to_owned(), false);
        }
        // Whichever way this ends (done, failed, or the caller dropped the future), the key
        // is no longer being promoted by it.
        let _running = Running {
            promoting: &self.promoting,
            key,
        };
        loop {
            let result = self.promote(key).await;
            let mut running = self.promoting.lock().unwrap_or_else(|e| e.into_inner());
            match running.get_mut(key) {
                Some(again) if *again && result.is_ok() => *again = false,
                _ => return result,
            }
        }
    }

    /// [`EtcdLockStore::promote`] after a free that already succeeded: a failure here must not
    /// turn the caller's success into an error, and is repaired by the key's watchers and by
    /// the next `reap_expired`.
    pub(super) async fn promote_after_free(&self, key: &str) {
        if let Err(e) = self.promote(key).await {
            tracing::debug!(%key, error = %e, "handing a freed key on failed; watchers and the reaper retry");
        }
    }

    /// The reaper's pass over every queue: promotes each key that has waiters but no live
    /// grant (`live`), and drops the lapsed waiters of held keys.
    pub(super) async fn reap_queues(
        &self,
        live: &BTreeSet<String>,
        now: u64,
    ) -> Result<(), LockError> {
        let mut free = BTreeSet::new();
        for kv in self
            .scan("reap_expired waiters", self.layout.waiters())
            .await?
        {
            let Some((key, session_id)) = self.layout.parse_waiter(&kv.key) else {
                continue;
            };
            if !live.contains(&key) {
                free.insert(key);
                continue;
            }
            let waiter: WaiterRecord = decode(&kv.key, &kv.value)?;
            if waiter.deadline_ms < now {
                self.drop_waiter(&key, &session_id, &kv, &waiter).await?;
            }
        }
        for key in free {
            self.promote(&key).await?;
        }
        Ok(())
    }

    /// The retention pass (at most every [`FORGET_INTERVAL`] per store): deletes request
    /// records older than `REQUEST_RETENTION`, raising each session's `forgot/` mark to the
    /// highest id it deleted in the same transaction.
    pub(super) async fn forget_old_requests(&self, now: u64) -> Result<(), LockError> {
        {
            let mut last = self.last_forget.lock().unwrap_or_else(|e| e.into_inner());
            let t = Instant::now();
            if last.is_some_and(|at| t.duration_since(at) < FORGET_INTERVAL) {
                return Ok(());
            }
            *last = Some(t);
        }
        let retention_ms = REQUEST_RETENTION.as_millis() as u64;
        let mut old: BTreeMap<String, Vec<(u64, KeyValue)>> = BTreeMap::new();
        for kv in self
            .scan("reap_expired requests", self.layout.requests())
            .await?
        {
            let Some((session_id, request_id)) = self.layout.parse_request(&kv.key) else {
                continue;
            };
            let record: RequestRecord = decode(&kv.key, &kv.value)?;
            // A queued acquire's record is its live state, not a memory: it goes when the
            // wait ends (then it is rewritten, and ages from there).
            if record.answer != Answer::Queued && record.at_ms.saturating_add(retention_ms) < now {
                old.entry(session_id).or_default().push((request_id, kv));
            }
        }
        for (session_id, records) in old {
            for chunk in records.chunks(FORGETS_PER_TXN_MAX) {
                let forgot_key = self.layout.forgot(&session_id);
                let session_key = self.layout.session(&session_id);
                let read = self
                    .read_all("reap_expired forgot", vec![get(forgot_key.clone())])
                    .await?;
                let (mark, mark_rev) = match ops::one(&read, 0)? {
                    Some(kv) => (
                        decode::<Forgotten>(&kv.key, &kv.value)?.request_id,
                        kv.mod_revision,
                    ),
                    None => (0, 0),
                };
                let highest = chunk.iter().map(|(id, _)| *id).max().unwrap_or(0).max(mark);
                let lease = chunk.first().map(|(_, kv)| kv.lease).unwrap_or(0);
                // The session record exists only while its lease lives, so the put on that
                // lease cannot fail for a lease that ended.
                let mut compare =
                    vec![exists(session_key), unchanged(forgot_key.clone(), mark_rev)];
                let mut success = vec![put(
                    forgot_key,
                    encode(&Forgotten {
                        request_id: highest,
                    })?,
                    lease,
                )];
                for (_, kv) in chunk {
                    compare.push(unchanged(kv.key.clone(), kv.mod_revision));
                    success.push(delete(kv.key.clone()));
                }
                // A conflict (a session ending, a record rewritten) leaves the records to the
                // next pass.
                self.txn(
                    "reap_expired requests",
                    TxnRequest {
                        compare,
                        success,
                        failure: vec![],
                    },
                )
                .await?;
            }
        }
        Ok(())
    }
}
