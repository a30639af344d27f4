//! [`EtcdLockStore`]: `lock_api::LockStore` + `lock_api::SessionRegistry` over etcd v3 (C2 §2.5,
//! "dev.lock.server.store.etcd"), behind cargo feature `etcd`.
//!
//! Owns the key layout in etcd and the transactions of each SPI method. Holds no lock state:
//! every node pointed at the same etcd cluster serves the same lock table. Must never report a
//! transport failure (unavailable member, timeout, lost connection) as "lost": every gRPC
//! error is `LockError::Contention`, except etcd's "lease not found" on a grant, which is an
//! unknown session (`InvalidArgument`).
//!
//! # Layout under the prefix
//!
//! - `session/<id>` = the owner id, attached to the session's lease. A session **is** an etcd
//!   lease; its id is the lease id in 16 hex digits.
//! - `lock/<key>` = a [`GrantRecord`], attached to the holder's session lease, so a session
//!   that dies takes its grants with it in the same etcd step (FR-04 cascade).
//! - `revocation/<key>/<uuid>` = a [`RevocationRecord`] (the audit trail), written in the same
//!   transaction that deletes the grant.
//!
//! # Tokens (FR-10)
//!
//! The fencing token is the ModRevision of the put that created the grant — the revision of
//! the granting transaction, which is also the key's CreateRevision for the grant's whole life.
//! etcd revisions are one global, strictly increasing counter, so a later grant of any key has
//! a larger token, and a revoke's transaction revision is a floor above every earlier token.
//! `extend` rewrites the record (new expiry) and so changes the ModRevision, never the
//! CreateRevision: the `(key, token)` predicate compares the CreateRevision.
//!
//! A grant's own lease (its TTL) is the expiry written in the record, checked against this
//! node's wall clock; etcd leases are whole seconds and belong to sessions.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_api::{
    LockError, LockHandle, LockInfo, LockOutcome, LockStore, SessionRegistry, validate,
};
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};

use crate::log_limit::{LogLimit, Note};

/// The etcd stubs: package `etcdserverpb` of the etcd API subset generated in `lock-proto`
/// (`proto/proto/etcd/`, its feature `etcd`).
pub use lock_proto::etcd::etcdserverpb as wire;

use lock_proto::etcd::mvccpb::KeyValue;
use wire::compare::{CompareResult, CompareTarget, TargetUnion};
use wire::kv_client::KvClient;
use wire::lease_client::LeaseClient;
use wire::request_op::Request;
use wire::response_op::Response;
use wire::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse,
};

/// Every call to etcd gives up after this long (then `Contention`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Connecting to a member gives up after this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Compare-and-swap rounds one call makes before answering `Contention` (FR-28): each failed
/// round means another writer changed the same key in between.
pub const CAS_ROUNDS_MAX: usize = 8;
/// Grants one scan (`reap_expired`, `locks_of`, `close_session`) reads at most.
pub const SCAN_KEYS_MAX: i64 = 100_000;
/// The first byte of every stored record: its format version.
const RECORD_FORMAT: u8 = 1;

/// A grant as stored under `lock/<key>`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GrantRecord {
    /// The holder's owner id (the session's owner).
    pub owner_id: String,
    /// The holder's session id.
    pub session_id: String,
    /// When the grant was made, wall-clock ms since the epoch.
    pub acquired_ms: u64,
    /// When the grant expires unless extended, wall-clock ms since the epoch.
    pub expires_ms: u64,
}

/// The audit record of a force-revoke, under `revocation/<key>/<uuid>`; its CreateRevision is
/// the new token floor.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RevocationRecord {
    /// Who revoked.
    pub operator: String,
    /// Why.
    pub reason: String,
    /// The displaced holder's owner, if any.
    pub previous_owner_id: Option<String>,
    /// The displaced grant's token, if any.
    pub previous_token: Option<u64>,
    /// When, wall-clock ms since the epoch.
    pub revoked_ms: u64,
}

/// The lock table in etcd. Cheap to clone (the gRPC channel is shared).
#[derive(Clone, Debug)]
pub struct EtcdLockStore {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    prefix: String,
    /// Scans that hit [`SCAN_KEYS_MAX`]: every reaper tick does while the table is that big,
    /// so it is logged when it starts and then once a minute.
    scans_cut: Arc<Mutex<LogLimit>>,
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn encode<T: Serialize>(record: &T) -> Result<Vec<u8>, LockError> {
    let mut bytes = vec![RECORD_FORMAT];
    bytes.extend(postcard::to_stdvec(record).map_err(|e| contention("encoding a record", e))?);
    Ok(bytes)
}

fn decode<T: for<'de> Deserialize<'de>>(key: &[u8], bytes: &[u8]) -> Result<T, LockError> {
    match bytes.split_first() {
        Some((&RECORD_FORMAT, rest)) => postcard::from_bytes(rest).map_err(|e| {
            contention(
                "decoding a record",
                format!("{}: {e}", String::from_utf8_lossy(key)),
            )
        }),
        _ => Err(contention(
            "decoding a record",
            format!("{}: unknown format", String::from_utf8_lossy(key)),
        )),
    }
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

fn compare(
    key: Vec<u8>,
    target: CompareTarget,
    result: CompareResult,
    value: TargetUnion,
) -> Compare {
    Compare {
        result: result as i32,
        target: target as i32,
        key,
        target_union: Some(value),
        range_end: Vec::new(),
    }
}

fn put(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key,
            value,
            lease,
            ..Default::default()
        })),
    }
}

fn delete(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
            key,
            ..Default::default()
        })),
    }
}

fn get(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key,
            ..Default::default()
        })),
    }
}

/// The single key a failure-branch range returned, if any.
fn ranged(resp: &TxnResponse, index: usize) -> Option<&KeyValue> {
    match resp.responses.get(index).and_then(|r| r.response.as_ref()) {
        Some(Response::ResponseRange(r)) => r.kvs.first(),
        _ => None,
    }
}

fn revision_of(resp: &TxnResponse) -> Result<u64, LockError> {
    token_of(resp.header.as_ref().map(|h| h.revision).unwrap_or(0))
}

impl EtcdLockStore {
    /// Connects to the etcd members at `endpoints` (`http://host:port`, any member serves) and
    /// keeps everything under `prefix` (e.g. `lockd/`).
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
                    .timeout(CALL_TIMEOUT)
                    .tcp_nodelay(true),
            );
        }
        let channel = Channel::balance_list(list.into_iter());
        Ok(EtcdLockStore {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
            prefix: prefix.to_owned(),
            scans_cut: Arc::default(),
        })
    }

    fn lock_key(&self, key: &str) -> Vec<u8> {
        format!("{}lock/{key}", self.prefix).into_bytes()
    }

    fn session_key(&self, session_id: &str) -> Vec<u8> {
        format!("{}session/{session_id}", self.prefix).into_bytes()
    }

    async fn txn(&self, what: &str, req: TxnRequest) -> Result<TxnResponse, LockError> {
        self.kv
            .clone()
            .txn(req)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| status(what, s))
    }

    async fn get_one(&self, what: &str, key: Vec<u8>) -> Result<Option<KeyValue>, LockError> {
        let resp = self
            .kv
            .clone()
            .range(RangeRequest {
                key,
                ..Default::default()
            })
            .await
            .map_err(|s| status(what, s))?
            .into_inner();
        Ok(resp.kvs.into_iter().next())
    }

    /// Every stored grant (bounded by [`SCAN_KEYS_MAX`]).
    async fn scan_grants(&self, what: &str) -> Result<Vec<(KeyValue, GrantRecord)>, LockError> {
        let start = format!("{}lock/", self.prefix).into_bytes();
        // The range end is the prefix with its last byte ('/') incremented.
        let end = format!("{}lock0", self.prefix).into_bytes();
        let resp = self
            .kv
            .clone()
            .range(RangeRequest {
                key: start,
                range_end: end,
                limit: SCAN_KEYS_MAX,
                ..Default::default()
            })
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
                    "etcd {what}: more grants than one scan reads"
                ),
                Some(Note::Summary(s)) => tracing::warn!(
                    limit = SCAN_KEYS_MAX,
                    scans = s.count,
                    for_s = s.lasted.as_secs(),
                    "etcd scans still read only part of the grants"
                ),
            }
        } else if let Some(ended) = scans_cut.succeeded(now) {
            tracing::info!(
                scans = ended.total,
                for_ms = ended.lasted.as_millis() as u64,
                "etcd scans read every grant again"
            );
        }
        drop(scans_cut);
        resp.kvs
            .into_iter()
            .map(|kv| {
                let record = decode(&kv.key, &kv.value)?;
                Ok((kv, record))
            })
            .collect()
    }

    fn key_name(&self, kv: &KeyValue) -> String {
        let full = String::from_utf8_lossy(&kv.key);
        full.strip_prefix(&format!("{}lock/", self.prefix))
            .unwrap_or(&full)
            .to_owned()
    }

    /// The live grants of a session's lease.
    async fn grants_of(&self, lease: i64) -> Result<Vec<(KeyValue, GrantRecord)>, LockError> {
        let now = now_ms();
        Ok(self
            .scan_grants("locks_of")
            .await?
            .into_iter()
            .filter(|(kv, record)| kv.lease == lease && record.expires_ms > now)
            .collect())
    }
}

impl LockStore for EtcdLockStore {
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
        let ttl_ms = validate::ttl(ttl)?;
        let lease = lease_of(session_id).ok_or_else(|| unknown_session(session_id))?;
        let started = Instant::now();
        let lock_key = self.lock_key(key);
        let session_key = self.session_key(session_id);
        for _ in 0..CAS_ROUNDS_MAX {
            let Some(session) = self
                .get_one("try_insert session", session_key.clone())
                .await?
            else {
                return Err(unknown_session(session_id));
            };
            let owner = String::from_utf8_lossy(&session.value).into_owned();
            let acquired_ms = now_ms();
            let record = GrantRecord {
                owner_id: owner.clone(),
                session_id: session_id.to_owned(),
                acquired_ms,
                expires_ms: acquired_ms.saturating_add(ttl_ms),
            };
            // Free key and live session, or nothing: one etcd transaction.
            let req = TxnRequest {
                compare: vec![
                    compare(
                        lock_key.clone(),
                        CompareTarget::Create,
                        CompareResult::Equal,
                        TargetUnion::CreateRevision(0),
                    ),
                    compare(
                        session_key.clone(),
                        CompareTarget::Create,
                        CompareResult::Equal,
                        TargetUnion::CreateRevision(session.create_revision),
                    ),
                ],
                success: vec![put(lock_key.clone(), encode(&record)?, lease)],
                failure: vec![get(lock_key.clone()), get(session_key.clone())],
            };
            let resp = match self.kv.clone().txn(req).await {
                Ok(r) => r.into_inner(),
                Err(s) if s.code() == tonic::Code::NotFound => {
                    return Err(unknown_session(session_id));
                }
                Err(s) => return Err(status("try_insert", s)),
            };
            if resp.succeeded {
                let token = revision_of(&resp)?;
                return Ok(Some(LockHandle {
                    key: key.to_owned(),
                    owner_id: owner,
                    session_id: session_id.to_owned(),
                    fencing_token: token,
                    ttl,
                    client_deadline: started + ttl,
                    server_expiry: system_time(record.expires_ms),
                }));
            }
            if ranged(&resp, 1).is_none() {
                return Err(unknown_session(session_id));
            }
            let Some(held) = ranged(&resp, 0) else {
                continue;
            };
            let holder: GrantRecord = decode(&held.key, &held.value)?;
            if holder.expires_ms > now_ms() {
                return Ok(None);
            }
            // An expired grant is already gone (C2: reaping is liveness only): clear it if it
            // is still that same grant, then try again.
            self.txn(
                "try_insert clearing an expired grant",
                TxnRequest {
                    compare: vec![compare(
                        lock_key.clone(),
                        CompareTarget::Mod,
                        CompareResult::Equal,
                        TargetUnion::ModRevision(held.mod_revision),
                    )],
                    success: vec![delete(lock_key.clone())],
                    failure: vec![],
                },
            )
            .await?;
        }
        Err(contention(
            "try_insert",
            format!("no decision after {CAS_ROUNDS_MAX} compare-and-swap rounds"),
        ))
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
        let lock_key = self.lock_key(key);
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
                        compare: vec![compare(
                            lock_key.clone(),
                            CompareTarget::Mod,
                            CompareResult::Equal,
                            TargetUnion::ModRevision(kv.mod_revision),
                        )],
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
        Err(contention(
            "extend",
            format!("no decision after {CAS_ROUNDS_MAX} compare-and-swap rounds"),
        ))
    }

    async fn delete_if_owner(&self, key: &str, fencing_token: u64) -> Result<bool, LockError> {
        validate::key(key)?;
        validate::fencing_token(fencing_token)?;
        let token = i64::try_from(fencing_token).map_err(|_| {
            LockError::invalid(format!("fencing_token: {fencing_token} is out of range"))
        })?;
        let lock_key = self.lock_key(key);
        let resp = self
            .txn(
                "delete_if_owner",
                TxnRequest {
                    compare: vec![compare(
                        lock_key.clone(),
                        CompareTarget::Create,
                        CompareResult::Equal,
                        TargetUnion::CreateRevision(token),
                    )],
                    success: vec![delete(lock_key)],
                    failure: vec![],
                },
            )
            .await?;
        Ok(resp.succeeded)
    }

    async fn read(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        validate::key(key)?;
        let Some(kv) = self.get_one("read", self.lock_key(key)).await? else {
            return Ok(None);
        };
        let record: GrantRecord = decode(&kv.key, &kv.value)?;
        if record.expires_ms <= now_ms() {
            return Ok(None);
        }
        Ok(Some(LockInfo {
            key: key.to_owned(),
            owner_id: record.owner_id,
            session_id: record.session_id,
            fencing_token: token_of(kv.create_revision)?,
            acquired_at: system_time(record.acquired_ms),
            expires_at: system_time(record.expires_ms),
            waiter_count: 0,
        }))
    }

    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        validate::key(key)?;
        validate::operator(operator)?;
        validate::reason(reason)?;
        let lock_key = self.lock_key(key);
        for _ in 0..CAS_ROUNDS_MAX {
            let held = self.get_one("revoke", lock_key.clone()).await?;
            let previous = match &held {
                Some(kv) => Some((
                    decode::<GrantRecord>(&kv.key, &kv.value)?.owner_id,
                    token_of(kv.create_revision)?,
                )),
                None => None,
            };
            let audit = RevocationRecord {
                operator: operator.to_owned(),
                reason: reason.to_owned(),
                previous_owner_id: previous.as_ref().map(|p| p.0.clone()),
                previous_token: previous.as_ref().map(|p| p.1),
                revoked_ms: now_ms(),
            };
            let audit_key = format!(
                "{}revocation/{key}/{}",
                self.prefix,
                uuid::Uuid::new_v4().simple()
            )
            .into_bytes();
            // Delete, advance the floor (this transaction's revision) and write the audit
            // record in one etcd transaction (C2 §2.5).
            let (guard, mut ops) = match &held {
                Some(kv) => (
                    compare(
                        lock_key.clone(),
                        CompareTarget::Mod,
                        CompareResult::Equal,
                        TargetUnion::ModRevision(kv.mod_revision),
                    ),
                    vec![delete(lock_key.clone())],
                ),
                None => (
                    compare(
                        lock_key.clone(),
                        CompareTarget::Create,
                        CompareResult::Equal,
                        TargetUnion::CreateRevision(0),
                    ),
                    vec![],
                ),
            };
            ops.push(put(audit_key, encode(&audit)?, 0));
            let resp = self
                .txn(
                    "revoke",
                    TxnRequest {
                        compare: vec![guard],
                        success: ops,
                        failure: vec![],
                    },
                )
                .await?;
            if resp.succeeded {
                return Ok(LockOutcome {
                    key: key.to_owned(),
                    revoked: previous.is_some(),
                    previous_owner_id: audit.previous_owner_id,
                    previous_token: audit.previous_token,
                    new_token_floor: revision_of(&resp)?,
                });
            }
        }
        Err(contention(
            "revoke",
            format!("no decision after {CAS_ROUNDS_MAX} compare-and-swap rounds"),
        ))
    }

    /// Deletes each grant whose expiry is before `now` if it is still the grant that was read
    /// (compare on ModRevision), so concurrent reapers delete each grant once between them.
    async fn reap_expired(&self, now: SystemTime) -> Result<usize, LockError> {
        let now = now
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let mut reaped = 0;
        for (kv, record) in self.scan_grants("reap_expired").await? {
            if record.expires_ms >= now {
                continue;
            }
            let resp = self
                .txn(
                    "reap_expired",
                    TxnRequest {
                        compare: vec![compare(
                            kv.key.clone(),
                            CompareTarget::Mod,
                            CompareResult::Equal,
                            TargetUnion::ModRevision(kv.mod_revision),
                        )],
                        success: vec![delete(kv.key.clone())],
                        failure: vec![],
                    },
                )
                .await?;
            if resp.succeeded {
                reaped += 1;
            }
        }
        Ok(reaped)
    }

    fn backend_id(&self) -> &'static str {
        "etcd"
    }
}

impl SessionRegistry for EtcdLockStore {
    /// The session's lease is `ttl` rounded up to whole seconds (etcd leases are in seconds, and
    /// etcd may raise a very short one to its own minimum).
    async fn open_session(&self, owner_id: &str, ttl: Duration) -> Result<String, LockError> {
        validate::owner_id(owner_id)?;
        let ttl_ms = validate::ttl(ttl)?;
        let ttl_s = i64::try_from(ttl_ms.div_ceil(1000))
            .map_err(|_| LockError::invalid(format!("ttl: {ttl_ms} ms does not fit")))?;
        let granted = self
            .lease
            .clone()
            .lease_grant(LeaseGrantRequest { ttl: ttl_s, id: 0 })
            .await
            .map_err(|s| status("open_session lease", s))?
            .into_inner();
        if !granted.error.is_empty() || granted.id <= 0 {
            return Err(contention("open_session lease", granted.error));
        }
        let session_id = format!("{:016x}", granted.id as u64);
        let written = self
            .kv
            .clone()
            .txn(TxnRequest {
                compare: vec![],
                success: vec![put(
                    self.session_key(&session_id),
                    owner_id.as_bytes().to_vec(),
                    granted.id,
                )],
                failure: vec![],
            })
            .await;
        if let Err(s) = written {
            // Best effort: an orphaned lease expires by itself within its TTL anyway.
            let _ = self
                .lease
                .clone()
                .lease_revoke(LeaseRevokeRequest { id: granted.id })
                .await;
            return Err(status("open_session record", s));
        }
        Ok(session_id)
    }

    /// One keep-alive of the session's lease. `false` (terminal) when etcd answers that the
    /// lease is gone: etcd has then already deleted every key attached to it — the session
    /// record and all its grants — in one step.
    async fn heartbeat(&self, session_id: &str, ttl: Duration) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::ttl(ttl)?;
        let Some(lease) = lease_of(session_id) else {
            return Ok(false);
        };
        let mut answers = self
            .lease
            .clone()
            .lease_keep_alive(tokio_stream::once(LeaseKeepAliveRequest { id: lease }))
            .await
            .map_err(|s| status("heartbeat", s))?
            .into_inner();
        match answers.message().await {
            Ok(Some(answer)) => Ok(answer.ttl > 0),
            Ok(None) => Err(contention(
                "heartbeat",
                "the keep-alive stream ended unanswered",
            )),
            Err(s) => Err(status("heartbeat", s)),
        }
    }

    /// Counts the session's live grants, then revokes its lease (which deletes them with the
    /// session record). A grant inserted on the same session while it is being closed is
    /// released too but may be missing from the count.
    async fn close_session(&self, session_id: &str) -> Result<usize, LockError> {
        validate::session_id(session_id)?;
        let Some(lease) = lease_of(session_id) else {
            return Ok(0);
        };
        if self
            .get_one("close_session", self.session_key(session_id))
            .await?
            .is_none()
        {
            return Ok(0);
        }
        let released = self.grants_of(lease).await?.len();
        match self
            .lease
            .clone()
            .lease_revoke(LeaseRevokeRequest { id: lease })
            .await
        {
            Ok(_) => Ok(released),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(0),
            Err(s) => Err(status("close_session", s)),
        }
    }

    async fn locks_of(&self, session_id: &str) -> Result<BTreeSet<String>, LockError> {
        validate::session_id(session_id)?;
        let Some(lease) = lease_of(session_id) else {
            return Ok(BTreeSet::new());
        };
        Ok(self
            .grants_of(lease)
            .await?
            .iter()
            .map(|(kv, _)| self.key_name(kv))
            .collect())
    }
}
