//! [`EtcdLockStore`]: `lock_api::LockStore` + `lock_api::SessionRegistry` +
//! `lock_api::RequestStore` over etcd v3 (C2 §2.5, "dev.lock.server.store.etcd"), behind cargo
//! feature `etcd`.
//!
//! Owns the transactions of each method; the key layout is `layout`, the watch stream
//! `watch`, the queue's promote step `queue`, the request-carrying methods `requests`. Holds no
//! lock state: every node pointed at the same etcd cluster serves the same lock table. Must
//! never report a transport failure (unavailable member, timeout, lost connection) as "lost":
//! every gRPC error is `LockError::Contention`, except etcd's "lease not found" on a write,
//! which is an unknown session (`InvalidArgument`).
//!
//! # Layout under the prefix
//!
//! - `session/<id>` = the owner id, on the session's lease. A session **is** an etcd lease;
//!   its id is the lease id in 16 hex digits, and its TTL the lease's, in whole seconds.
//! - `principal/<id>` = the principal a bound session belongs to (docs/SECURITY.md §3), on the
//!   session's lease, written in the transaction that writes `session/<id>`.
//! - `lock/<key>` = a [`GrantRecord`], on the holder's session lease, so a session that dies
//!   takes its grants with it in the same etcd step (FR-04 cascade).
//! - `waiter/<key>\0<session>` = a [`WaiterRecord`] (request id, TTL, wait deadline), on the
//!   waiting session's lease. The queue of a key is its waiter keys in CreateRevision order.
//! - `request/<session>/<request id>` = a [`RequestRecord`], the answer a retry gets, on the
//!   session's lease, written in the same transaction as the request's effect (D-idempotency);
//!   `reap_expired` deletes records older than `REQUEST_RETENTION` and records the highest id
//!   it deleted in `forgot/<session>`, so a retry of a forgotten request is answered
//!   `Contention` ("unknown outcome"), never guessed at.
//! - `slot/<session>/h/<key>` and `slot/<session>/w/<key>`: the session's grants and waits, the
//!   index that bounds them (the Raft table's LOCKS_PER_SESSION_MAX and
//!   WAITS_PER_SESSION_MAX) and lists `locks_of` without a scan; on the session's lease.
//! - `revocation/<key>\0<uuid>` = a [`RevocationRecord`] (the audit trail, with the revoke's
//!   request id for the retry window), written in the transaction that deletes the grant; the
//!   newest `AUDIT_LOG_MAX` are kept (`audit`).
//!
//! `\0` ends a lock key inside a longer etcd key: keys may contain `/`, never a control
//! character, so the range of key `a`'s waiters never holds key `a/b`'s.
//!
//! # Tokens (FR-10)
//!
//! The fencing token is the ModRevision of the put that created the grant — the revision of
//! the granting transaction, which is also the key's CreateRevision for the grant's whole life.
//! etcd revisions are one global, strictly increasing counter, so a later grant of any key has
//! a larger token, and a revoke's transaction revision is a floor above every earlier token.
//! `extend` rewrites the record (new expiry) and so changes the ModRevision, never the
//! CreateRevision: the `(key, token)` predicate compares the CreateRevision. A grant is never
//! written over an old one (a put over a key keeps its CreateRevision): an expired grant is
//! deleted first, in a transaction of its own.
//!
//! A grant's own lease (its TTL) is the expiry written in the record, checked against this
//! node's wall clock; etcd leases are whole seconds and belong to sessions.
//!
//! # The queue and the hand-off (D-wait)
//!
//! An acquire that finds the key held (or other waiters queued) puts its waiter key; a new
//! acquire never overtakes a waiter: its granting transaction compares that the key's waiter
//! range is empty. Whatever frees a key — a release, a revoke, closing the holder's session, a
//! cancel that releases, the reaper deleting an expired grant — then runs the **promote**
//! step (`queue`): read the head waiter (lowest CreateRevision, dropping waiters whose
//! deadline passed on the way), and in one transaction, conditional on `lock/<key>` being
//! absent and the head's waiter key unchanged, put the grant (token = that transaction's
//! revision), write the head's request record "granted" and delete its waiter key. Being
//! conditional, any node may run it, and two nodes running it at once grant once. A key freed
//! by etcd itself (a session lease ending deletes its `lock/` keys) or by the clock (an
//! expired grant record) is promoted by the nodes whose local waiters watch it and by every
//! `reap_expired`.
//!
//! # Waiting (`wait_for_grant`)
//!
//! A waiter reads its request record, its waiter key and `lock/<key>` at one revision R, then
//! watches its waiter key and `lock/<key>` from R + 1 (one watch stream per store, `watch`), so
//! nothing between the read and the watch is missed. Its waiter key's delete means its outcome
//! is recorded (granted, dropped, cancelled, session ended): it reads its request record. A
//! delete of `lock/<key>`, or the holder's expiry passing, makes it run the promote step; its
//! own deadline passing makes it drop its waiter.
//!
//! # Differences from the Raft backend
//!
//! - Session TTLs are etcd lease TTLs, whole seconds (rounded up, and raised to etcd's
//!   minimum, about 2 s at default settings); `open_session_with_ttl` and `keep_alive` answer
//!   the TTL etcd granted.
//! - Request answers are kept for `REQUEST_RETENTION` (10 minutes) rather than as the last 64
//!   of each session; a retry older than that is `Contention` ("unknown outcome") where the
//!   Raft table answers `StaleRequest`.
//! - Wait deadlines and grant expiries are wall-clock times compared with each node's clock,
//!   where the Raft table compares the leader's stamps.
//! - The Raft table's bounds are checked exactly once a count is within `BOUND_EXACT_MARGIN`
//!   of its bound (`requests`); below that, more acquires than the margin racing at one
//!   instant could overshoot it together, where the Raft table is exact always.
//! - A hand-off after a free that etcd itself made (a session lease ending) or that the clock
//!   made (an expired grant) is as fast as the key's local watchers (at once) or the reaper
//!   (its interval), not part of the same step.

mod audit;
mod layout;
mod ops;
mod queue;
mod requests;
mod watch;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_api::{
    LockError, LockHandle, LockInfo, LockOutcome, LockStore, SessionRegistry, validate,
};
use tonic::transport::{Channel, Endpoint};

use crate::log_limit::{LogLimit, Note};

/// The etcd stubs: package `etcdserverpb` of the etcd API subset generated in `lock-proto`
/// (`proto/proto/etcd/`, its feature `etcd`).
pub use lock_proto::etcd::etcdserverpb as wire;

pub use layout::{
    Answer, CancelAnswer, GrantAnswer, GrantRecord, RequestRecord, RevocationRecord, WaiterRecord,
};

use layout::{Layout, decode, encode, prefix_end};
use lock_proto::etcd::mvccpb::KeyValue;
use ops::{absent, created_at, delete, get, put, range_empty, unchanged};
use watch::WatchHub;
use wire::kv_client::KvClient;
use wire::lease_client::LeaseClient;
use wire::{
    Compare, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, RangeRequest, RequestOp,
    TxnRequest, TxnResponse,
};

/// Every call to etcd gives up after this long (then `Contention`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Connecting to a member gives up after this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Compare-and-swap rounds one call makes before answering `Contention` (FR-28): each failed
/// round means another writer changed the same key in between.
pub const CAS_ROUNDS_MAX: usize = 8;
/// Reads one read-only transaction makes at most (etcd's default `--max-txn-ops` is 128).
pub const READS_PER_TXN_MAX: usize = 128;
/// Keys one scan (`reap_expired`, its waiter and request passes) reads at most.
pub const SCAN_KEYS_MAX: i64 = 100_000;

/// The lock table in etcd. Cheap to clone (the gRPC channel and the watch stream are shared).
#[derive(Clone, Debug)]
pub struct EtcdLockStore {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    layout: Layout,
    hub: Arc<WatchHub>,
    /// Scans that hit [`SCAN_KEYS_MAX`]: every reaper tick does while the table is that big,
    /// so it is logged when it starts and then once a minute.
    scans_cut: Arc<Mutex<LogLimit>>,
    /// When this store last ran the retention pass over request records (`queue`).
    last_forget: Arc<Mutex<Option<Instant>>>,
    /// Keys a promote step of this store's waiters is running on, each with "run again when
    /// done" (`queue::promote_coalesced`).
    promoting: Arc<Mutex<HashMap<String, bool>>>,
}

fn contention(what: &str, e: impl std::fmt::Display) -> LockError {
    LockError::contention(format!("etcd {what}: {e}"))
}

fn status(what: &str, s: tonic::Status) -> LockError {
    contention(what, format!("{:?}: {}", s.code(), s.message()))
}

fn unknown_session(session_id: &str) -> LockError {
    LockError::invalid(format!(
        "session_id: unknown or expired session {session_id:?}"
    ))
}

fn no_decision(what: &str) -> LockError {
    contention(
        what,
        format!("no decision after {CAS_ROUNDS_MAX} compare-and-swap rounds"),
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// A session id is its lease id in hex; anything else names no session.
fn lease_of(session_id: &str) -> Option<i64> {
    u64::from_str_radix(session_id, 16)
        .ok()
        .map(|id| id as i64)
        .filter(|id| *id > 0)
}

fn token_of(revision: i64) -> Result<u64, LockError> {
    u64::try_from(revision)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| contention("revision", format!("non-positive revision {revision}")))
}

fn revision_of(resp: &TxnResponse) -> Result<u64, LockError> {
    token_of(ops::revision(resp))
}

/// A handle for a grant made by someone else (a hand-off, an earlier attempt), valid for what
/// is left of its lease by this node's clock, never more than its TTL.
fn handle_of(key: &str, session_id: &str, token: u64, grant: &GrantAnswer) -> LockHandle {
    let ttl = Duration::from_millis(grant.ttl_ms);
    let left = Duration::from_millis(grant.expires_ms.saturating_sub(now_ms())).min(ttl);
    LockHandle {
        key: key.to_owned(),
        owner_id: grant.owner_id.clone(),
        session_id: session_id.to_owned(),
        fencing_token: token,
        ttl,
        client_deadline: Instant::now() + left,
        server_expiry: system_time(grant.expires_ms),
    }
}

impl EtcdLockStore {
    /// Connects to the etcd members at `endpoints` (`http://host:port`, any member serves) and
    /// keeps everything under `prefix` (e.g. `lockd/`). Starts the store's watch stream task
    /// on the current tokio runtime (it connects when the first waiter watches).
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdLockStore, LockError> {
        if endpoints.is_empty() {
            return Err(LockError::invalid("etcd endpoints: none given"));
        }
        let mut list = Vec::new();
        for url in endpoints {
            list.push(
                Endpoint::from_shared(url.clone())
                    .map_err(|e| LockError::invalid(format!("etcd endpoint {url:?}: {e}")))?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true),
            );
        }
        let channel = Channel::balance_list(list.into_iter());
        Ok(EtcdLockStore {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            layout: Layout::new(prefix),
            // The watch stream lives as long as its waiters: no call timeout on its channel's
            // requests (each unary call sets its own, below).
            hub: WatchHub::start(channel),
            scans_cut: Arc::default(),
            last_forget: Arc::default(),
            promoting: Arc::default(),
        })
    }

    async fn txn(&self, what: &str, req: TxnRequest) -> Result<TxnResponse, LockError> {
        let mut request = tonic::Request::new(req);
        request.set_timeout(CALL_TIMEOUT);
        self.kv
            .clone()
            .txn(request)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| status(what, s))
    }

    /// A transaction that writes keys on `session_id`'s lease: etcd's "lease not found" (the
    /// lease ended between the read and the write) is the unknown session it means.
    async fn txn_on_lease(
        &self,
        what: &str,
        session_id: &str,
        req: TxnRequest,
    ) -> Result<TxnResponse, LockError> {
        let mut request = tonic::Request::new(req);
        request.set_timeout(CALL_TIMEOUT);
        match self.kv.clone().txn(request).await {
            Ok(r) => Ok(r.into_inner()),
            Err(s) if s.code() == tonic::Code::NotFound => Err(unknown_session(session_id)),
            Err(s) => Err(status(what, s)),
        }
    }

    /// Reads several keys at one revision (a transaction of reads only).
    async fn read_all(&self, what: &str, reads: Vec<RequestOp>) -> Result<TxnResponse, LockError> {
        self.txn(
            what,
            TxnRequest {
                compare: vec![],
                success: reads,
                failure: vec![],
            },
        )
        .await
    }

    async fn get_one(&self, what: &str, key: Vec<u8>) -> Result<Option<KeyValue>, LockError> {
        let mut request = tonic::Request::new(RangeRequest {
            key,
            ..Default::default()
        });
        request.set_timeout(CALL_TIMEOUT);
        let resp = self
            .kv
            .clone()
            .range(request)
            .await
            .map_err(|s| status(what, s))?
            .into_inner();
        Ok(resp.kvs.into_iter().next())
    }

    /// Every key of `[start, prefix_end(start))` (bounded by [`SCAN_KEYS_MAX`]).
    async fn scan(&self, what: &str, start: Vec<u8>) -> Result<Vec<KeyValue>, LockError> {
        let end = prefix_end(&start);
        let mut request = tonic::Request::new(RangeRequest {
            key: start,
            range_end: end,
            limit: SCAN_KEYS_MAX,
            ..Default::default()
        });
        request.set_timeout(CALL_TIMEOUT);
        let resp = self
            .kv
            .clone()
            .range(request)
            .await
            .map_err(|s| status(what, s))?
            .into_inner();
        let now = tokio::time::Instant::now().into_std();
        let mut scans_cut = self.scans_cut.lock().unwrap_or_else(|e| e.into_inner());
        if resp.more {
            match scans_cut.failed(now, &what) {
                None => {}
                Some(Note::Began) => tracing::warn!(
                    limit = SCAN_KEYS_MAX,
                    "etcd {what}: more keys than one scan reads"
                ),
                Some(Note::Summary(s)) => tracing::warn!(
                    limit = SCAN_KEYS_MAX,
                    scans = s.count,
                    for_s = s.lasted.as_secs(),
                    "etcd scans still read only part of the keys"
                ),
            }
        } else if let Some(ended) = scans_cut.succeeded(now) {
            tracing::info!(
                scans = ended.total,
                for_ms = ended.lasted.as_millis() as u64,
                "etcd scans read every key again"
            );
        }
        drop(scans_cut);
        Ok(resp.kvs)
    }

    /// The operations that end grant `record` of `key`: the grant and its slot.
    fn free_ops(&self, key: &str, record: &GrantRecord) -> Vec<RequestOp> {
        vec![
            delete(self.layout.lock(key)),
            delete(self.layout.held(&record.session_id, key)),
        ]
    }

    /// The operations that make grant `record` of `key` on `lease`: the grant and its slot.
    fn grant_ops(
        &self,
        key: &str,
        record: &GrantRecord,
        lease: i64,
    ) -> Result<Vec<RequestOp>, LockError> {
        Ok(vec![
            put(self.layout.lock(key), encode(record)?, lease),
            put(self.layout.held(&record.session_id, key), Vec::new(), lease),
        ])
    }

    /// Deletes the expired grant `kv` if it is still the one read; `true` if it did.
    async fn clear_expired(
        &self,
        what: &str,
        key: &str,
        kv: &KeyValue,
        record: &GrantRecord,
    ) -> Result<bool, LockError> {
        let resp = self
            .txn(
                what,
                TxnRequest {
                    compare: vec![unchanged(kv.key.clone(), kv.mod_revision)],
                    success: self.free_ops(key, record),
                    failure: vec![],
                },
            )
            .await?;
        Ok(resp.succeeded)
    }

    /// The keys `session_id` holds (its held slots).
    async fn held_keys(&self, session_id: &str) -> Result<BTreeSet<String>, LockError> {
        Ok(self
            .scan("locks_of", self.layout.helds(session_id))
            .await?
            .iter()
            .map(|kv| self.layout.key_of_held(session_id, &kv.key))
            .collect())
    }
}

impl LockStore for EtcdLockStore {
    /// The grant carries the session's owner; `owner_id` must be valid but is not compared
    /// (as in the Raft store). A key with waiters is not free (the queue goes first, as for
    /// `acquire_request`): it answers `Ok(None)` and hands the key to its first waiter if
    /// nobody did yet.
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
        let ttl_ms = validate::ttl(ttl)?;
        let lease = lease_of(session_id).ok_or_else(|| unknown_session(session_id))?;
        let started = Instant::now();
        let lock_key = self.layout.lock(key);
        let session_key = self.layout.session(session_id);
        let queue = self.layout.queue(key);
        let queue_end = prefix_end(&queue);
        for _ in 0..CAS_ROUNDS_MAX {
            let read = self
                .read_all(
                    "try_insert",
                    vec![
                        get(session_key.clone()),
                        get(lock_key.clone()),
                        ops::range_by_age(queue.clone(), queue_end.clone(), 1, false),
                    ],
                )
                .await?;
            let Some(session) = ops::one(&read, 0)? else {
                return Err(unknown_session(session_id));
            };
            if let Some(held) = ops::one(&read, 1)? {
                let holder: GrantRecord = decode(&held.key, &held.value)?;
                if holder.expires_ms > now_ms() {
                    return Ok(None);
                }
                // An expired grant is already gone (C2: reaping is liveness only): clear it
                // and hand the key on, then look again.
                self.promote(key).await?;
                continue;
            }
            if ops::one(&read, 2)?.is_some() {
                // Free, but others wait: the key is theirs. Hand it on if nobody did yet.
                self.promote(key).await?;
                if self.read_grant(key).await?.is_some() {
                    return Ok(None);
                }
                continue;
            }
            let owner = String::from_utf8_lossy(&session.value).into_owned();
            let acquired_ms = now_ms();
            let record = GrantRecord {
                owner_id: owner.clone(),
                session_id: session_id.to_owned(),
                acquired_ms,
                expires_ms: acquired_ms.saturating_add(ttl_ms),
            };
            // Free key, empty queue and live session, or nothing: one etcd transaction.
            let req = TxnRequest {
                compare: vec![
                    absent(lock_key.clone()),
                    range_empty(queue.clone(), queue_end.clone()),
                    created_at(session_key.clone(), session.create_revision),
                ],
                success: self.grant_ops(key, &record, lease)?,
                failure: vec![],
            };
            let resp = self.txn_on_lease("try_insert", session_id, req).await?;
            if resp.succeeded {
                return Ok(Some(LockHandle {
                    key: key.to_owned(),
                    owner_id: owner,
                    session_id: session_id.to_owned(),
                    fencing_token: revision_of(&resp)?,
                    ttl,
                    client_deadline: started + ttl,
                    server_expiry: system_time(record.expires_ms),
                }));
            }
        }
        Err(no_decision("try_insert"))
    }

    async fn extend(
        &self,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::key(key)?;
        validate::fencing_token(fencing_token)?;
        let ttl_ms = validate::ttl(ttl)?;
        let started = Instant::now();
        let lock_key = self.layout.lock(key);
        for _ in 0..CAS_ROUNDS_MAX {
            let Some(kv) = self.get_one("extend", lock_key.clone()).await? else {
                return Ok(None);
            };
            let mut record: GrantRecord = decode(&kv.key, &kv.value)?;
            let now = now_ms();
            if token_of(kv.create_revision)? != fencing_token || record.expires_ms <= now {
                return Ok(None);
            }
            record.expires_ms = now.saturating_add(ttl_ms);
            let resp = self
                .txn(
                    "extend",
                    TxnRequest {
                        compare: vec![unchanged(lock_key.clone(), kv.mod_revision)],
                        success: vec![put(lock_key.clone(), encode(&record)?, kv.lease)],
                        failure: vec![],
                    },
                )
                .await?;
            if resp.succeeded {
                return Ok(Some(LockHandle {
                    key: key.to_owned(),
                    owner_id: record.owner_id,
                    session_id: record.session_id,
                    fencing_token,
                    ttl,
                    client_deadline: started + ttl,
                    server_expiry: system_time(record.expires_ms),
                }));
            }
        }
        Err(no_decision("extend"))
    }

    /// Compare-and-delete on `(key, token)`; the key then goes to its first waiter.
    async fn delete_if_owner(&self, key: &str, fencing_token: u64) -> Result<bool, LockError> {
        validate::key(key)?;
        validate::fencing_token(fencing_token)?;
        let released = self
            .delete_grant(
                "delete_if_owner",
                key,
                fencing_token,
                (vec![], vec![]),
                None,
            )
            .await?;
        if released {
            self.promote_after_free(key).await;
        }
        Ok(released)
    }

    async fn read(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        validate::key(key)?;
        self.read_grant(key).await
    }

    /// Deletes the grant, advances the floor and writes the audit record in one transaction;
    /// the key then goes to its first waiter.
    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        validate::key(key)?;
        validate::operator(operator)?;
        validate::reason(reason)?;
        for _ in 0..CAS_ROUNDS_MAX {
            if let Some(outcome) = self.revoke_attempt(key, operator, reason, 0, None).await? {
                self.promote_after_free(key).await;
                return Ok(outcome);
            }
        }
        Err(no_decision("revoke"))
    }

    /// Deletes each grant whose expiry is before `now` if it is still the grant that was read
    /// (compare on ModRevision), so concurrent reapers delete each grant once between them,
    /// and hands each freed key on. Then, as liveness for what no event announces: promotes
    /// every key that has waiters but no live grant (its holder's session lease ended, or a
    /// promote after a free failed), drops waiters whose deadline passed, and forgets request
    /// records older than `REQUEST_RETENTION`. Counts the grants it deleted.
    async fn reap_expired(&self, now: SystemTime) -> Result<usize, LockError> {
        let now = now
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let mut reaped = 0;
        let mut live = BTreeSet::new();
        for kv in self.scan("reap_expired", self.layout.locks()).await? {
            let record: GrantRecord = decode(&kv.key, &kv.value)?;
            let key = self.layout.key_of_lock(&kv.key);
            if record.expires_ms >= now {
                live.insert(key);
                continue;
            }
            if self
                .clear_expired("reap_expired", &key, &kv, &record)
                .await?
            {
                reaped += 1;
            }
        }
        self.reap_queues(&live, now).await?;
        self.forget_old_requests(now).await?;
        Ok(reaped)
    }

    fn backend_id(&self) -> &'static str {
        "etcd"
    }
}

impl EtcdLockStore {
    /// The live grant of `key` with its queue's length (waiters whose deadline passed do not
    /// count: they are gone, even if nobody deleted their keys yet).
    async fn read_grant(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let queue = self.layout.queue(key);
        let read = self
            .read_all(
                "read",
                vec![
                    get(self.layout.lock(key)),
                    ops::range_by_age(queue.clone(), prefix_end(&queue), 0, false),
                ],
            )
            .await?;
        let Some(kv) = ops::one(&read, 0)? else {
            return Ok(None);
        };
        let record: GrantRecord = decode(&kv.key, &kv.value)?;
        let now = now_ms();
        if record.expires_ms <= now {
            return Ok(None);
        }
        let mut waiter_count = 0u32;
        for w in &ops::range_result(&read, 1)?.kvs {
            let waiter: WaiterRecord = decode(&w.key, &w.value)?;
            if waiter.deadline_ms >= now {
                waiter_count += 1;
            }
        }
        Ok(Some(LockInfo {
            key: key.to_owned(),
            owner_id: record.owner_id,
            session_id: record.session_id,
            fencing_token: token_of(kv.create_revision)?,
            acquired_at: system_time(record.acquired_ms),
            expires_at: system_time(record.expires_ms),
            waiter_count,
        }))
    }

    /// Compare-and-delete of grant `(key, token)` and its slot, with `extra` compares and
    /// operations in the same transaction (a request record), written on `session_id`'s lease
    /// if one is named. `true` if it deleted.
    async fn delete_grant(
        &self,
        what: &str,
        key: &str,
        fencing_token: u64,
        extra: (Vec<Compare>, Vec<RequestOp>),
        session_id: Option<&str>,
    ) -> Result<bool, LockError> {
        let token = i64::try_from(fencing_token).map_err(|_| {
            LockError::invalid(format!("fencing_token: {fencing_token} is out of range"))
        })?;
        let lock_key = self.layout.lock(key);
        let Some(kv) = self.get_one(what, lock_key.clone()).await? else {
            return Ok(false);
        };
        if kv.create_revision != token {
            return Ok(false);
        }
        let record: GrantRecord = decode(&kv.key, &kv.value)?;
        let mut compare = vec![created_at(lock_key, token)];
        compare.extend(extra.0);
        let mut success = self.free_ops(key, &record);
        success.extend(extra.1);
        let req = TxnRequest {
            compare,
            success,
            failure: vec![],
        };
        let resp = match session_id {
            Some(s) => self.txn_on_lease(what, s, req).await?,
            None => self.txn(what, req).await?,
        };
        Ok(resp.succeeded)
    }

    /// One attempt of a revoke transaction (see [`LockStore::revoke`]) recording
    /// `request_id`; `None` if another writer changed the key in between (or, with
    /// `no_revocation_since`, revoked it after that revision). The audit record's
    /// CreateRevision is the new floor.
    async fn revoke_attempt(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
        no_revocation_since: Option<i64>,
    ) -> Result<Option<LockOutcome>, LockError> {
        let lock_key = self.layout.lock(key);
        let held = self.get_one("revoke", lock_key.clone()).await?;
        let previous = match &held {
            Some(kv) => Some((
                decode::<GrantRecord>(&kv.key, &kv.value)?,
                token_of(kv.create_revision)?,
            )),
            None => None,
        };
        let audit = RevocationRecord {
            operator: operator.to_owned(),
            reason: reason.to_owned(),
            previous_owner_id: previous.as_ref().map(|p| p.0.owner_id.clone()),
            previous_token: previous.as_ref().map(|p| p.1),
            revoked_ms: now_ms(),
            request_id,
        };
        // Delete, advance the floor (this transaction's revision) and write the audit record
        // in one etcd transaction (C2 §2.5).
        let (guard, mut success) = match (&held, &previous) {
            (Some(kv), Some((record, _))) => (
                unchanged(lock_key.clone(), kv.mod_revision),
                self.free_ops(key, record),
            ),
            _ => (absent(lock_key.clone()), vec![]),
        };
        let mut compare = vec![guard];
        if let Some(read) = no_revocation_since {
            let start = self.layout.revocations(key);
            let end = prefix_end(&start);
            compare.push(ops::range_unchanged_since(start, end, read));
        }
        success.push(put(self.layout.revocation(key), encode(&audit)?, 0));
        let resp = self
            .txn(
                "revoke",
                TxnRequest {
                    compare,
                    success,
                    failure: vec![],
                },
            )
            .await?;
        if !resp.succeeded {
            return Ok(None);
        }
        self.trim_revocations().await;
        Ok(Some(LockOutcome {
            key: key.to_owned(),
            revoked: previous.is_some(),
            previous_owner_id: audit.previous_owner_id,
            previous_token: audit.previous_token,
            new_token_floor: revision_of(&resp)?,
        }))
    }
}

impl SessionRegistry for EtcdLockStore {
    /// The session's lease is `ttl` rounded up to whole seconds (etcd leases are in seconds, and
    /// etcd may raise a very short one to its own minimum).
    async fn open_session(&self, owner_id: &str, ttl: Duration) -> Result<String, LockError> {
        Ok(self.open_lease_session(owner_id, ttl, None).await?.0)
    }

    /// One keep-alive of the session's lease, by the lease's own TTL (`ttl` is checked, not
    /// used: etcd renews a lease by the TTL it was granted). `false` (terminal) when etcd
    /// answers that the lease is gone: etcd has then already deleted every key attached to it —
    /// the session record, its grants, waiters and request records — in one step.
    async fn heartbeat(&self, session_id: &str, ttl: Duration) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::ttl(ttl)?;
        Ok(self.keep_lease_alive(session_id).await?.is_some())
    }

    /// Counts the session's grants, then revokes its lease (which deletes them with its
    /// waiters, request records and the session record), then hands each freed key on. A grant
    /// inserted on the same session while it is being closed is released too but may be
    /// missing from the count (and is handed on by the watchers and the reaper).
    async fn close_session(&self, session_id: &str) -> Result<usize, LockError> {
        validate::session_id(session_id)?;
        let Some(lease) = lease_of(session_id) else {
            return Ok(0);
        };
        if self
            .get_one("close_session", self.layout.session(session_id))
            .await?
            .is_none()
        {
            return Ok(0);
        }
        let held = self.held_keys(session_id).await?;
        let mut request = tonic::Request::new(LeaseRevokeRequest { id: lease });
        request.set_timeout(CALL_TIMEOUT);
        match self.lease.clone().lease_revoke(request).await {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(0),
            Err(s) => return Err(status("close_session", s)),
        }
        for key in &held {
            self.promote_after_free(key).await;
        }
        Ok(held.len())
    }

    async fn locks_of(&self, session_id: &str) -> Result<BTreeSet<String>, LockError> {
        validate::session_id(session_id)?;
        if lease_of(session_id).is_none() {
            return Ok(BTreeSet::new());
        }
        // The slots list what the session holds; a grant whose expiry passed is gone even
        // before the reaper deletes its slot. The grants are read in batches, each at one
        // revision (etcd takes at most 128 operations in one transaction).
        let held: Vec<String> = self.held_keys(session_id).await?.into_iter().collect();
        let mut live = BTreeSet::new();
        let now = now_ms();
        for batch in held.chunks(READS_PER_TXN_MAX) {
            let reads = batch.iter().map(|k| get(self.layout.lock(k))).collect();
            let read = self.read_all("locks_of", reads).await?;
            for (i, key) in batch.iter().enumerate() {
                if let Some(kv) = ops::one(&read, i)? {
                    let record: GrantRecord = decode(&kv.key, &kv.value)?;
                    if record.session_id == session_id && record.expires_ms > now {
                        live.insert(key.clone());
                    }
                }
            }
        }
        Ok(live)
    }
}

impl EtcdLockStore {
    /// Grants a lease of `ttl` rounded up to whole seconds and writes the session record on it;
    /// returns the session id and the TTL etcd granted.
    async fn open_lease_session(
        &self,
        owner_id: &str,
        ttl: Duration,
        principal: Option<&str>,
    ) -> Result<(String, Duration), LockError> {
        validate::owner_id(owner_id)?;
        let ttl_ms = validate::ttl(ttl)?;
        let ttl_s = i64::try_from(ttl_ms.div_ceil(1000))
            .map_err(|_| LockError::invalid(format!("ttl: {ttl_ms} ms does not fit")))?;
        let mut request = tonic::Request::new(LeaseGrantRequest { ttl: ttl_s, id: 0 });
        request.set_timeout(CALL_TIMEOUT);
        let granted = self
            .lease
            .clone()
            .lease_grant(request)
            .await
            .map_err(|s| status("open_session lease", s))?
            .into_inner();
        if !granted.error.is_empty() || granted.id <= 0 {
            return Err(contention("open_session lease", granted.error));
        }
        let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl.max(ttl_s)).unwrap_or(0));
        let session_id = format!("{:016x}", granted.id as u64);
        let written = self
            .txn(
                "open_session record",
                TxnRequest {
                    compare: vec![],
                    // The principal in the same transaction as the session, on its lease: the
                    // session never exists unbound if it was opened bound.
                    success: std::iter::once(put(
                        self.layout.session(&session_id),
                        owner_id.as_bytes().to_vec(),
                        granted.id,
                    ))
                    .chain(principal.map(|p| {
                        put(
                            self.layout.principal(&session_id),
                            p.as_bytes().to_vec(),
                            granted.id,
                        )
                    }))
                    .collect(),
                    failure: vec![],
                },
            )
            .await;
        if let Err(e) = written {
            // Best effort: an orphaned lease expires by itself within its TTL anyway.
            let mut revoke = tonic::Request::new(LeaseRevokeRequest { id: granted.id });
            revoke.set_timeout(CALL_TIMEOUT);
            let _ = self.lease.clone().lease_revoke(revoke).await;
            return Err(e);
        }
        Ok((session_id, granted_ttl))
    }

    /// One keep-alive of the session's lease: `Some(its TTL)`, or `None` if the lease is gone.
    async fn keep_lease_alive(&self, session_id: &str) -> Result<Option<Duration>, LockError> {
        let Some(lease) = lease_of(session_id) else {
            return Ok(None);
        };
        let mut request =
            tonic::Request::new(tokio_stream::once(LeaseKeepAliveRequest { id: lease }));
        request.set_timeout(CALL_TIMEOUT);
        let mut answers = self
            .lease
            .clone()
            .lease_keep_alive(request)
            .await
            .map_err(|s| status("keep_alive", s))?
            .into_inner();
        match answers.message().await {
            Ok(Some(answer)) if answer.ttl > 0 => Ok(Some(Duration::from_secs(
                u64::try_from(answer.ttl).unwrap_or(0),
            ))),
            Ok(Some(_)) => Ok(None),
            Ok(None) => Err(contention(
                "keep_alive",
                "the keep-alive stream ended unanswered",
            )),
            Err(s) => Err(status("keep_alive", s)),
        }
    }
}
