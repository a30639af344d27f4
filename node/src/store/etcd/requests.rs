//! `impl lock_api::RequestStore for EtcdLockStore`: the request-carrying methods (request
//! ids, the FIFO wait, the session TTL), on the layout and the queue of the sibling modules.
//!
//! Owns the transactions of these methods and the waiting loop of `wait_for_grant`. Every
//! effect is written in one transaction together with its request record, and every
//! transaction compares that the record is still absent (or unchanged), so a retry — even one
//! racing its first attempt — gets the first answer and never a second effect.

use std::time::{Duration, Instant};

use lock_api::limits::REVOKE_RETRY_WINDOW;
use lock_api::{Acquired, Cancelled, LockError, LockHandle, LockOutcome, RequestStore, validate};
use lock_proto::etcd::mvccpb::KeyValue;
use lock_proto::etcd::mvccpb::event::EventType;
use lock_raft_store::limits::{LOCKS_PER_SESSION_MAX, WAITERS_PER_KEY_MAX, WAITS_PER_SESSION_MAX};

use super::layout::{Forgotten, WaitSlot, decode, encode, prefix_end};
use super::ops::{self, absent, created_at, delete, get, put, range_empty, unchanged};
use super::watch::WatchNote;
use super::wire::{Compare, RequestOp, TxnRequest, TxnResponse};
use super::{
    Answer, CAS_ROUNDS_MAX, CancelAnswer, EtcdLockStore, GrantAnswer, GrantRecord, RequestRecord,
    WaiterRecord, contention, handle_of, lease_of, no_decision, now_ms, revision_of, system_time,
    unknown_session,
};

/// Revocations of one key that a revoke retry looks through, newest first, for its first
/// attempt (they are also bounded by `REVOKE_RETRY_WINDOW`: a key revoked this often within a
/// minute is an operator's loop, not a retry).
pub const REVOKE_SCAN_MAX: i64 = 64;

/// How close to one of the Raft table's bounds (LOCKS_PER_SESSION_MAX, WAITS_PER_SESSION_MAX,
/// WAITERS_PER_KEY_MAX) a count must be for an acquire to check it exactly: within the margin
/// the acquire's transaction also compares that nothing joined the counted range since it was
/// read, so racing acquires cannot overshoot the bound together; below it, that compare would
/// make every acquire on a busy key (or of a busy session) conflict with every other and retry,
/// and the bound holds as long as fewer than this many acquires race at one instant.
pub const BOUND_EXACT_MARGIN: usize = 64;

/// First pause before `wait_for_grant` reads again after a failed read or promote.
pub const WAIT_RETRY_MIN: Duration = Duration::from_millis(50);
/// Longest such pause.
pub const WAIT_RETRY_MAX: Duration = Duration::from_secs(2);

fn request_id_valid(request_id: u64) -> Result<(), LockError> {
    if request_id == 0 {
        return Err(LockError::invalid("request_id: 0 is not a request id"));
    }
    Ok(())
}

fn forgotten(session_id: &str, request_id: u64) -> LockError {
    LockError::contention(format!(
        "request {request_id} of session {session_id} is older than the answers etcd keeps \
         (REQUEST_RETENTION): its outcome is unknown"
    ))
}

fn reused(session_id: &str, request_id: u64, what: &str) -> LockError {
    LockError::invalid(format!(
        "request_id: {request_id} of session {session_id} was already used for {what}"
    ))
}

/// The `forgot/` mark of a read and its ModRevision (0, 0 when absent).
fn mark_of(kv: Option<&KeyValue>) -> Result<(u64, i64), LockError> {
    match kv {
        Some(kv) => Ok((
            decode::<Forgotten>(&kv.key, &kv.value)?.request_id,
            kv.mod_revision,
        )),
        None => Ok((0, 0)),
    }
}

/// Where a queued request stands, as read at one revision.
enum State {
    /// Granted (by its acquire or a hand-off).
    Granted(LockHandle),
    /// Not waiting and not granted: dropped, cancelled, never queued, or its session ended.
    Ended,
    /// Still queued.
    Waiting {
        waiter: KeyValue,
        record: WaiterRecord,
        grant: Option<(KeyValue, GrantRecord)>,
        revision: i64,
    },
}

/// What an acquire will do, decided from one read.
enum Plan {
    Grant,
    Queue,
    NotGranted,
}

/// Pauses before the next read after a failure, doubling up to [`WAIT_RETRY_MAX`].
async fn back_off(pause: &mut Duration) {
    tokio::time::sleep(*pause).await;
    *pause = (*pause * 2).min(WAIT_RETRY_MAX);
}

/// The tokio instant of wall-clock `ms` (now if it passed).
fn instant_of(ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_millis(ms.saturating_sub(now_ms()))
}

impl EtcdLockStore {
    /// Reads request `(session_id, request_id)` on `key`: its record, its waiter key and the
    /// key's grant, at one revision.
    async fn request_state(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<State, LockError> {
        let read = self
            .read_all(
                "wait_for_grant",
                vec![
                    get(self.layout.request(session_id, request_id)),
                    get(self.layout.waiter(key, session_id)),
                    get(self.layout.lock(key)),
                ],
            )
            .await?;
        let Some(rkv) = ops::one(&read, 0)? else {
            return Ok(State::Ended);
        };
        let record: RequestRecord = decode(&rkv.key, &rkv.value)?;
        match record.answer {
            Answer::Granted(g) => Ok(State::Granted(handle_of(
                &record.key,
                session_id,
                g.token_at(rkv.mod_revision),
                &g,
            ))),
            Answer::Queued => {
                let Some(waiter) = ops::one(&read, 1)? else {
                    return Ok(State::Ended);
                };
                let w: WaiterRecord = decode(&waiter.key, &waiter.value)?;
                if w.request_id != request_id {
                    return Ok(State::Ended);
                }
                let grant = match ops::one(&read, 2)? {
                    Some(kv) => Some((kv.clone(), decode::<GrantRecord>(&kv.key, &kv.value)?)),
                    None => None,
                };
                Ok(State::Waiting {
                    waiter: waiter.clone(),
                    record: w,
                    grant,
                    revision: ops::revision(&read),
                })
            }
            Answer::NotGranted | Answer::Released(_) => Ok(State::Ended),
        }
    }

    /// A transaction on `session_id`'s lease whose "lease not found" means the session ended.
    async fn txn_or_ended(
        &self,
        what: &str,
        session_id: &str,
        req: TxnRequest,
    ) -> Result<Option<TxnResponse>, LockError> {
        match self.txn_on_lease(what, session_id, req).await {
            Ok(r) => Ok(Some(r)),
            Err(LockError::InvalidArgument { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the answer of a cancel that found nothing to withdraw or release, beside the
    /// acquire's answer `answer` (unchanged record `rkv`, or none: a tombstone). `false` on a
    /// conflict.
    async fn remember_cancel(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        lease: i64,
        base: (Vec<Compare>, Option<(&KeyValue, RequestRecord)>),
    ) -> Result<bool, LockError> {
        let (mut compare, existing) = base;
        let record = match existing {
            Some((rkv, record)) => {
                compare.push(unchanged(rkv.key.clone(), rkv.mod_revision));
                RequestRecord {
                    at_ms: now_ms(),
                    cancel: Some(CancelAnswer {
                        grant: None,
                        released: false,
                    }),
                    ..record.resolved(rkv.mod_revision)
                }
            }
            None => {
                compare.push(absent(self.layout.request(session_id, request_id)));
                RequestRecord {
                    key: key.to_owned(),
                    at_ms: now_ms(),
                    answer: Answer::NotGranted,
                    cancel: Some(CancelAnswer {
                        grant: None,
                        released: false,
                    }),
                }
            }
        };
        let req = TxnRequest {
            compare,
            success: vec![put(
                self.layout.request(session_id, request_id),
                encode(&record)?,
                lease,
            )],
            failure: vec![],
        };
        Ok(self
            .txn_or_ended("cancel_request", session_id, req)
            .await?
            .is_some_and(|r| r.succeeded))
    }
}

impl RequestStore for EtcdLockStore {
    /// The TTL is the lease's as etcd granted it: `ttl` rounded up to whole seconds, or etcd's
    /// minimum lease if that is longer.
    async fn open_session_with_ttl(
        &self,
        owner_id: &str,
        ttl: Duration,
    ) -> Result<(String, Duration), LockError> {
        self.open_lease_session(owner_id, ttl, None).await
    }

    async fn open_bound_session(
        &self,
        owner_id: &str,
        ttl: Duration,
        principal: &str,
    ) -> Result<(String, Duration), LockError> {
        validate::principal(principal)?;
        self.open_lease_session(owner_id, ttl, Some(principal))
            .await
    }

    async fn session_principal(&self, session_id: &str) -> Result<Option<String>, LockError> {
        validate::session_id(session_id)?;
        let Some(kv) = self
            .get_one("session_principal", self.layout.principal(session_id))
            .await?
        else {
            return Ok(None);
        };
        String::from_utf8(kv.value).map(Some).map_err(|_| {
            LockError::contention(format!(
                "etcd: the principal of session {session_id:?} is not UTF-8"
            ))
        })
    }

    async fn keep_alive(&self, session_id: &str) -> Result<Option<Duration>, LockError> {
        validate::session_id(session_id)?;
        self.keep_lease_alive(session_id).await
    }

    async fn acquire_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Acquired, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        request_id_valid(request_id)?;
        let ttl_ms = validate::ttl(ttl)?;
        let wait_ms = validate::max_wait(wait)?;
        let lease = lease_of(session_id).ok_or_else(|| unknown_session(session_id))?;
        let started = Instant::now();
        let l = &self.layout;
        let (session_key, request_key, forgot_key) = (
            l.session(session_id),
            l.request(session_id, request_id),
            l.forgot(session_id),
        );
        let (lock_key, own_waiter) = (l.lock(key), l.waiter(key, session_id));
        let queue = l.queue(key);
        let queue_end = prefix_end(&queue);
        let slots = l.slots(session_id);
        let slots_end = prefix_end(&slots);
        let helds = l.helds(session_id);
        let waits = l.waits(session_id);
        for _ in 0..CAS_ROUNDS_MAX {
            let read = self
                .read_all(
                    "acquire",
                    vec![
                        get(session_key.clone()),
                        get(request_key.clone()),
                        get(forgot_key.clone()),
                        get(lock_key.clone()),
                        ops::range_by_age(queue.clone(), queue_end.clone(), 1, false),
                        ops::count(queue.clone(), queue_end.clone()),
                        get(own_waiter.clone()),
                        ops::count(helds.clone(), prefix_end(&helds)),
                        ops::range_by_age(waits.clone(), prefix_end(&waits), 0, false),
                    ],
                )
                .await?;
            let revision = ops::revision(&read);
            let Some(session) = ops::one(&read, 0)? else {
                return Err(unknown_session(session_id));
            };
            if let Some(rkv) = ops::one(&read, 1)? {
                // A retry: the first attempt's current state.
                let record: RequestRecord = decode(&rkv.key, &rkv.value)?;
                return match record.answer {
                    Answer::Granted(g) => Ok(Acquired::Granted(handle_of(
                        &record.key,
                        session_id,
                        g.token_at(rkv.mod_revision),
                        &g,
                    ))),
                    Answer::Queued => {
                        match self
                            .request_state(session_id, request_id, &record.key)
                            .await?
                        {
                            State::Granted(h) => Ok(Acquired::Granted(h)),
                            State::Waiting { record: w, .. } if w.deadline_ms >= now_ms() => {
                                Ok(Acquired::Queued)
                            }
                            _ => Ok(Acquired::NotGranted),
                        }
                    }
                    Answer::NotGranted => Ok(Acquired::NotGranted),
                    Answer::Released(_) => Err(reused(session_id, request_id, "a release")),
                };
            }
            let (mark, mark_rev) = mark_of(ops::one(&read, 2)?)?;
            if request_id <= mark {
                return Err(forgotten(session_id, request_id));
            }
            let now = now_ms();
            if let Some(w) = ops::one(&read, 6)? {
                let waiter: WaiterRecord = decode(&w.key, &w.value)?;
                if waiter.deadline_ms < now {
                    // A lapsed wait of this session's is gone already: clear it, look again.
                    self.drop_waiter(key, session_id, w, &waiter).await?;
                    continue;
                }
                return Err(LockError::invalid(format!(
                    "session {session_id} already waits on key {key} (request id {}); cancel \
                     that wait before queueing another",
                    waiter.request_id
                )));
            }
            let held = match ops::one(&read, 3)? {
                Some(kv) => {
                    let record: GrantRecord = decode(&kv.key, &kv.value)?;
                    if record.expires_ms <= now {
                        // Expired: gone. Hand it to the queue (or just clear it), look again.
                        self.promote(key).await?;
                        continue;
                    }
                    Some((kv, record))
                }
                None => {
                    if ops::one(&read, 4)?.is_some() {
                        // Free with waiters: a hand-off nobody completed yet. It goes to the
                        // queue's head, never to this request.
                        self.promote(key).await?;
                        continue;
                    }
                    None
                }
            };
            let plan = match &held {
                Some((_, g)) if g.session_id == session_id => Plan::NotGranted,
                Some(_) if wait_ms == 0 => Plan::NotGranted,
                Some(_) => Plan::Queue,
                None => Plan::Grant,
            };
            let waiting = {
                let mut live = 0usize;
                for kv in &ops::range_result(&read, 8)?.kvs {
                    if decode::<WaitSlot>(&kv.key, &kv.value)?.deadline_ms >= now {
                        live += 1;
                    }
                }
                live
            };
            let used = ops::counted(&read, 7)? as usize + waiting;
            if !matches!(plan, Plan::NotGranted) && used >= LOCKS_PER_SESSION_MAX {
                return Err(LockError::invalid(format!(
                    "session {session_id} holds or waits for {used} locks; the limit \
                     LOCKS_PER_SESSION_MAX is {LOCKS_PER_SESSION_MAX}"
                )));
            }
            if matches!(plan, Plan::Queue) {
                if waiting >= WAITS_PER_SESSION_MAX {
                    return Err(LockError::invalid(format!(
                        "session {session_id} waits on {waiting} keys; the limit \
                         WAITS_PER_SESSION_MAX is {WAITS_PER_SESSION_MAX}"
                    )));
                }
                let queued = ops::counted(&read, 5)? as usize;
                if queued >= WAITERS_PER_KEY_MAX {
                    return Err(LockError::invalid(format!(
                        "key {key} has {queued} waiters; the limit WAITERS_PER_KEY_MAX is \
                         {WAITERS_PER_KEY_MAX}"
                    )));
                }
            }
            let mut compare = vec![
                created_at(session_key.clone(), session.create_revision),
                absent(request_key.clone()),
                unchanged(forgot_key.clone(), mark_rev),
            ];
            // Near a bound, nothing may join the counted range between the read and the write
            // (exact, at the price of conflicting with every racing acquire); far from it, a
            // conflict would only cost retries.
            if !matches!(plan, Plan::NotGranted)
                && used + BOUND_EXACT_MARGIN >= LOCKS_PER_SESSION_MAX
            {
                compare.push(ops::range_unchanged_since(
                    slots.clone(),
                    slots_end.clone(),
                    revision,
                ));
            }
            let remembered = |answer: Answer| -> Result<RequestOp, LockError> {
                let record = RequestRecord {
                    key: key.to_owned(),
                    at_ms: now,
                    answer,
                    cancel: None,
                };
                Ok(put(request_key.clone(), encode(&record)?, lease))
            };
            let owner = String::from_utf8_lossy(&session.value).into_owned();
            let expires_ms = now.saturating_add(ttl_ms);
            let mut success: Vec<RequestOp> = Vec::new();
            match plan {
                Plan::Grant => {
                    compare.push(absent(lock_key.clone()));
                    compare.push(range_empty(queue.clone(), queue_end.clone()));
                    let record = GrantRecord {
                        owner_id: owner.clone(),
                        session_id: session_id.to_owned(),
                        acquired_ms: now,
                        expires_ms,
                    };
                    success.extend(self.grant_ops(key, &record, lease)?);
                    success.push(remembered(Answer::Granted(GrantAnswer {
                        token: 0,
                        owner_id: owner.clone(),
                        ttl_ms,
                        expires_ms,
                    }))?);
                }
                Plan::Queue => {
                    let held_rev = held.as_ref().map(|(kv, _)| kv.mod_revision).unwrap_or(0);
                    compare.push(unchanged(lock_key.clone(), held_rev));
                    if ops::counted(&read, 5)? as usize + BOUND_EXACT_MARGIN >= WAITERS_PER_KEY_MAX
                    {
                        compare.push(ops::range_unchanged_since(
                            queue.clone(),
                            queue_end.clone(),
                            revision,
                        ));
                    }
                    if waiting + BOUND_EXACT_MARGIN >= WAITS_PER_SESSION_MAX {
                        compare.push(ops::range_unchanged_since(
                            waits.clone(),
                            prefix_end(&waits),
                            revision,
                        ));
                    }
                    let deadline_ms = now.saturating_add(wait_ms);
                    let waiter = WaiterRecord {
                        request_id,
                        owner_id: owner.clone(),
                        ttl_ms,
                        deadline_ms,
                        queued_ms: now,
                    };
                    success.push(put(own_waiter.clone(), encode(&waiter)?, lease));
                    success.push(put(
                        self.layout.wait(session_id, key),
                        encode(&WaitSlot { deadline_ms })?,
                        lease,
                    ));
                    success.push(remembered(Answer::Queued)?);
                }
                Plan::NotGranted => {
                    let held_rev = held.as_ref().map(|(kv, _)| kv.mod_revision).unwrap_or(0);
                    compare.push(unchanged(lock_key.clone(), held_rev));
                    success.push(remembered(Answer::NotGranted)?);
                }
            }
            let resp = self
                .txn_on_lease(
                    "acquire",
                    session_id,
                    TxnRequest {
                        compare,
                        success,
                        failure: vec![],
                    },
                )
                .await?;
            if !resp.succeeded {
                continue;
            }
            return Ok(match plan {
                Plan::Grant => Acquired::Granted(LockHandle {
                    key: key.to_owned(),
                    owner_id: owner,
                    session_id: session_id.to_owned(),
                    fencing_token: revision_of(&resp)?,
                    ttl,
                    client_deadline: started + ttl,
                    server_expiry: system_time(expires_ms),
                }),
                Plan::Queue => Acquired::Queued,
                Plan::NotGranted => Acquired::NotGranted,
            });
        }
        Err(no_decision("acquire"))
    }

    /// Reads the request's state at a revision R and watches its waiter key and `lock/<key>`
    /// from R + 1 on the store's one watch stream (see the `etcd` module docs): woken by the
    /// hand-off's own delete of the waiter key, by a free of the key (then it runs the promote
    /// step itself), by the holder's expiry or its own deadline passing. A failed read is
    /// retried with backoff; the caller bounds the whole wait by dropping the future.
    async fn wait_for_grant(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        request_id_valid(request_id)?;
        let waiter_key = self.layout.waiter(key, session_id);
        let lock_key = self.layout.lock(key);
        let mut pause = WAIT_RETRY_MIN;
        loop {
            let (record, mut held_until, revision) = match self
                .request_state(session_id, request_id, key)
                .await
            {
                Err(e) => {
                    tracing::debug!(%key, error = %e, "wait_for_grant could not read; retrying");
                    back_off(&mut pause).await;
                    continue;
                }
                Ok(State::Granted(h)) => return Ok(Some(h)),
                Ok(State::Ended) => return Ok(None),
                Ok(State::Waiting {
                    waiter,
                    record,
                    grant,
                    revision,
                }) => {
                    let now = now_ms();
                    if record.deadline_ms < now {
                        if let Err(e) = self.drop_waiter(key, session_id, &waiter, &record).await {
                            tracing::debug!(%key, error = %e, "dropping a lapsed waiter failed");
                            back_off(&mut pause).await;
                        }
                        continue;
                    }
                    match grant {
                        Some((_, g)) if g.expires_ms > now => (record, g.expires_ms, revision),
                        // Free (or expired): a hand-off is due; complete it, then look again.
                        _ => {
                            if let Err(e) = self.promote(key).await {
                                tracing::debug!(%key, error = %e, "promote failed; retrying");
                                back_off(&mut pause).await;
                            }
                            continue;
                        }
                    }
                }
            };
            pause = WAIT_RETRY_MIN;
            let mut watch = self.hub.subscribe(
                vec![
                    (waiter_key.clone(), Vec::new()),
                    (lock_key.clone(), Vec::new()),
                ],
                revision + 1,
            );
            // Past the deadline (strictly: a deadline equal to the clock is still live).
            let deadline = instant_of(record.deadline_ms.saturating_add(1));
            loop {
                let expiry = instant_of(held_until);
                tokio::select! {
                    note = watch.next() => match note {
                        None => return Err(contention("wait_for_grant", "the store's watch stream is gone")),
                        Some(WatchNote::Lost) => break,
                        Some(WatchNote::Event(event)) => {
                            let Some(kv) = event.kv else { continue };
                            let deleted = event.r#type == EventType::Delete as i32;
                            if kv.key == waiter_key {
                                // Granted, dropped, cancelled or the session ended: the
                                // request record says which.
                                break;
                            }
                            if deleted {
                                if let Err(e) = self.promote_coalesced(key).await {
                                    tracing::debug!(%key, error = %e, "promote after a free failed; retrying");
                                    held_until = now_ms().saturating_add(WAIT_RETRY_MAX.as_millis() as u64);
                                }
                            } else if let Ok(g) = decode::<GrantRecord>(&kv.key, &kv.value) {
                                held_until = g.expires_ms;
                            }
                        }
                    },
                    () = tokio::time::sleep_until(deadline) => break,
                    () = tokio::time::sleep_until(expiry) => break,
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
        request_id_valid(request_id)?;
        let nothing = Cancelled {
            grant: None,
            released: false,
        };
        let Some(lease) = lease_of(session_id) else {
            return Ok(nothing);
        };
        let l = &self.layout;
        let (session_key, request_key, forgot_key) = (
            l.session(session_id),
            l.request(session_id, request_id),
            l.forgot(session_id),
        );
        let (waiter_key, lock_key) = (l.waiter(key, session_id), l.lock(key));
        for _ in 0..CAS_ROUNDS_MAX {
            let read = self
                .read_all(
                    "cancel_request",
                    vec![
                        get(session_key.clone()),
                        get(request_key.clone()),
                        get(waiter_key.clone()),
                        get(lock_key.clone()),
                        get(forgot_key.clone()),
                    ],
                )
                .await?;
            let Some(session) = ops::one(&read, 0)? else {
                return Ok(nothing);
            };
            let session_alive = created_at(session_key.clone(), session.create_revision);
            let Some(rkv) = ops::one(&read, 1)? else {
                // Unknown: a tombstone, so that the acquire, if it reaches etcd after its
                // cancel, finds its answer ("not granted") and does nothing.
                let (mark, mark_rev) = mark_of(ops::one(&read, 4)?)?;
                if request_id <= mark {
                    return Err(forgotten(session_id, request_id));
                }
                let base = vec![session_alive, unchanged(forgot_key.clone(), mark_rev)];
                if self
                    .remember_cancel(session_id, request_id, key, lease, (base, None))
                    .await?
                {
                    return Ok(nothing);
                }
                continue;
            };
            let record: RequestRecord = decode(&rkv.key, &rkv.value)?;
            if let Some(c) = &record.cancel {
                // A retry of the cancel.
                return Ok(Cancelled {
                    grant: c.grant.as_ref().map(|g| {
                        handle_of(&record.key, session_id, g.token_at(rkv.mod_revision), g)
                    }),
                    released: c.released,
                });
            }
            let live_here = matches!(record.answer, Answer::Queued | Answer::Granted(_));
            if live_here && record.key != key {
                return Err(LockError::invalid(format!(
                    "acquire {request_id} of session {session_id} is on key {}, not {key}",
                    record.key
                )));
            }
            let now = now_ms();
            match record.answer.clone() {
                Answer::Released(_) => return Err(reused(session_id, request_id, "a release")),
                Answer::Queued => {
                    let waiting = match ops::one(&read, 2)? {
                        Some(w) => {
                            let waiter: WaiterRecord = decode(&w.key, &w.value)?;
                            (waiter.request_id == request_id).then_some(w)
                        }
                        None => None,
                    };
                    let Some(w) = waiting else {
                        // It left the queue ungranted already.
                        if self
                            .remember_cancel(
                                session_id,
                                request_id,
                                key,
                                lease,
                                (vec![], Some((rkv, record))),
                            )
                            .await?
                        {
                            return Ok(nothing);
                        }
                        continue;
                    };
                    let answer = RequestRecord {
                        key: key.to_owned(),
                        at_ms: now,
                        answer: Answer::NotGranted,
                        cancel: Some(CancelAnswer {
                            grant: None,
                            released: false,
                        }),
                    };
                    // Withdrawn before a hand-off, or not at all: a hand-off rewrites the
                    // request record and deletes the waiter key, and either makes this fail.
                    let req = TxnRequest {
                        compare: vec![
                            unchanged(w.key.clone(), w.mod_revision),
                            unchanged(rkv.key.clone(), rkv.mod_revision),
                        ],
                        success: vec![
                            delete(w.key.clone()),
                            delete(self.layout.wait(session_id, key)),
                            put(request_key.clone(), encode(&answer)?, lease),
                        ],
                        failure: vec![],
                    };
                    match self.txn_or_ended("cancel_request", session_id, req).await? {
                        None => return Ok(nothing),
                        Some(r) if r.succeeded => {
                            if ops::one(&read, 3)?.is_none() {
                                // It may have been the head of a free key's queue.
                                self.promote_after_free(key).await;
                            }
                            return Ok(nothing);
                        }
                        Some(_) => continue,
                    }
                }
                Answer::Granted(g) => {
                    let token = g.token_at(rkv.mod_revision);
                    let held = ops::one(&read, 3)?
                        .filter(|kv| u64::try_from(kv.create_revision).ok() == Some(token));
                    let Some(lock) = held else {
                        // Its grant already ended.
                        if self
                            .remember_cancel(
                                session_id,
                                request_id,
                                key,
                                lease,
                                (vec![], Some((rkv, record))),
                            )
                            .await?
                        {
                            return Ok(nothing);
                        }
                        continue;
                    };
                    let grant = GrantAnswer { token, ..g };
                    let resolved = record.clone().resolved(rkv.mod_revision);
                    let (cancel, mut compare, mut success) = if release_if_granted {
                        let holder: GrantRecord = decode(&lock.key, &lock.value)?;
                        (
                            CancelAnswer {
                                grant: None,
                                released: true,
                            },
                            vec![created_at(lock_key.clone(), lock.create_revision)],
                            self.free_ops(key, &holder),
                        )
                    } else {
                        (
                            CancelAnswer {
                                grant: Some(grant.clone()),
                                released: false,
                            },
                            vec![],
                            vec![],
                        )
                    };
                    compare.push(unchanged(rkv.key.clone(), rkv.mod_revision));
                    let answer = RequestRecord {
                        at_ms: now,
                        cancel: Some(cancel),
                        ..resolved
                    };
                    success.push(put(request_key.clone(), encode(&answer)?, lease));
                    let req = TxnRequest {
                        compare,
                        success,
                        failure: vec![],
                    };
                    match self.txn_or_ended("cancel_request", session_id, req).await? {
                        None => return Ok(nothing),
                        Some(r) if r.succeeded => {
                            if release_if_granted {
                                self.promote_after_free(key).await;
                                return Ok(Cancelled {
                                    grant: None,
                                    released: true,
                                });
                            }
                            return Ok(Cancelled {
                                grant: Some(handle_of(key, session_id, token, &grant)),
                                released: false,
                            });
                        }
                        Some(_) => continue,
                    }
                }
                Answer::NotGranted => {
                    if self
                        .remember_cancel(
                            session_id,
                            request_id,
                            key,
                            lease,
                            (vec![], Some((rkv, record))),
                        )
                        .await?
                    {
                        return Ok(nothing);
                    }
                    continue;
                }
            }
        }
        Err(no_decision("cancel_request"))
    }

    async fn release_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        fencing_token: u64,
    ) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        validate::fencing_token(fencing_token)?;
        request_id_valid(request_id)?;
        let Some(lease) = lease_of(session_id) else {
            return Ok(false);
        };
        let token = i64::try_from(fencing_token).map_err(|_| {
            LockError::invalid(format!("fencing_token: {fencing_token} is out of range"))
        })?;
        let l = &self.layout;
        let (session_key, request_key, forgot_key, lock_key) = (
            l.session(session_id),
            l.request(session_id, request_id),
            l.forgot(session_id),
            l.lock(key),
        );
        for _ in 0..CAS_ROUNDS_MAX {
            let read = self
                .read_all(
                    "release",
                    vec![
                        get(session_key.clone()),
                        get(request_key.clone()),
                        get(forgot_key.clone()),
                        get(lock_key.clone()),
                    ],
                )
                .await?;
            let Some(session) = ops::one(&read, 0)? else {
                return Ok(false);
            };
            if let Some(rkv) = ops::one(&read, 1)? {
                let record: RequestRecord = decode(&rkv.key, &rkv.value)?;
                return match record.answer {
                    Answer::Released(released) => Ok(released),
                    _ => Err(reused(session_id, request_id, "an acquire")),
                };
            }
            let (mark, mark_rev) = mark_of(ops::one(&read, 2)?)?;
            if request_id <= mark {
                return Err(forgotten(session_id, request_id));
            }
            let mut compare = vec![
                created_at(session_key.clone(), session.create_revision),
                absent(request_key.clone()),
                unchanged(forgot_key.clone(), mark_rev),
            ];
            let lock = ops::one(&read, 3)?;
            let matches = lock.is_some_and(|kv| kv.create_revision == token);
            let mut success = Vec::new();
            match lock {
                Some(kv) if matches => {
                    let holder: GrantRecord = decode(&kv.key, &kv.value)?;
                    compare.push(created_at(lock_key.clone(), token));
                    success.extend(self.free_ops(key, &holder));
                }
                // No longer this grant; remembered as such, conditional on it staying so.
                Some(kv) => compare.push(unchanged(lock_key.clone(), kv.mod_revision)),
                None => compare.push(absent(lock_key.clone())),
            }
            let record = RequestRecord {
                key: key.to_owned(),
                at_ms: now_ms(),
                answer: Answer::Released(matches),
                cancel: None,
            };
            success.push(put(request_key.clone(), encode(&record)?, lease));
            let req = TxnRequest {
                compare,
                success,
                failure: vec![],
            };
            match self.txn_or_ended("release", session_id, req).await? {
                None => return Ok(false),
                Some(r) if r.succeeded => {
                    if matches {
                        self.promote_after_free(key).await;
                    }
                    return Ok(matches);
                }
                Some(_) => continue,
            }
        }
        Err(no_decision("release"))
    }

    /// A retry of `(key, operator, request_id)` finds its first attempt among the key's
    /// revocation audit records (newest first, within `REVOKE_RETRY_WINDOW`); the revoke
    /// itself compares that no revocation of the key was written since that look, so two
    /// racing attempts of one request revoke once.
    async fn revoke_request(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> Result<LockOutcome, LockError> {
        validate::key(key)?;
        validate::operator(operator)?;
        validate::reason(reason)?;
        if request_id == 0 {
            return lock_api::LockStore::revoke(self, key, operator, reason).await;
        }
        let start = self.layout.revocations(key);
        let end = prefix_end(&start);
        let window_ms = REVOKE_RETRY_WINDOW.as_millis() as u64;
        for _ in 0..CAS_ROUNDS_MAX {
            let read = self
                .read_all(
                    "revoke",
                    vec![ops::range_by_age(
                        start.clone(),
                        end.clone(),
                        REVOKE_SCAN_MAX,
                        true,
                    )],
                )
                .await?;
            let now = now_ms();
            for kv in &ops::range_result(&read, 0)?.kvs {
                let record: super::RevocationRecord = decode(&kv.key, &kv.value)?;
                if record.revoked_ms.saturating_add(window_ms) < now {
                    break;
                }
                if record.request_id == request_id && record.operator == operator {
                    return Ok(LockOutcome {
                        key: key.to_owned(),
                        revoked: record.previous_token.is_some(),
                        previous_owner_id: record.previous_owner_id,
                        previous_token: record.previous_token,
                        new_token_floor: super::token_of(kv.create_revision)?,
                    });
                }
            }
            if let Some(outcome) = self
                .revoke_attempt(
                    key,
                    operator,
                    reason,
                    request_id,
                    Some(ops::revision(&read)),
                )
                .await?
            {
                self.promote_after_free(key).await;
                return Ok(outcome);
            }
        }
        Err(no_decision("revoke"))
    }

    /// The newest `AUDIT_LOG_MAX` records under `revocation/`, by floor (`audit`).
    async fn revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> Result<Vec<lock_api::RevocationRecord>, LockError> {
        self.read_revocations(key, before_floor, limit).await
    }
}
