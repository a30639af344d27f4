//! An in-memory [`RequestStore`] for the stateless backend's tests: one FIFO queue per key,
//! remembered requests, a hand-off in the same step as a release, and a record of every
//! cancel the backend asked for. Lease expiry and wait deadlines are not modelled (the tests
//! drive those from the node's side); nothing here is used outside tests.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use lock_api::limits::AUDIT_LOG_MAX;
use lock_api::{
    Acquired, Cancelled, LockError, LockHandle, LockInfo, LockOutcome, LockStore, RequestStore,
    RevocationRecord, SessionRegistry,
};
use tokio::sync::watch;

/// One request's state, remembered for its retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestState {
    /// In `key`'s queue.
    Waiting,
    /// Granted with this handle.
    Granted(LockHandle),
    /// Not granted and not waiting.
    NotGranted,
}

/// A request's identity: `(session_id, request_id)`.
type RequestId = (String, u64);

#[derive(Debug, Default)]
struct Table {
    /// session id → (owner, ttl).
    sessions: HashMap<String, (String, Duration)>,
    /// session id → the principal it is bound to (bound sessions only).
    principals: HashMap<String, String>,
    /// key → (holder's request, handle).
    grants: BTreeMap<String, (RequestId, LockHandle)>,
    /// key → queued requests with their lease length, first first.
    queues: HashMap<String, VecDeque<(RequestId, Duration)>>,
    requests: HashMap<RequestId, RequestState>,
    /// The audit log, oldest first, at most `AUDIT_LOG_MAX` records.
    revocations: VecDeque<RevocationRecord>,
    next_token: u64,
    next_session: u64,
}

/// The test double.
#[derive(Debug)]
pub struct MemoryStore {
    table: Mutex<Table>,
    /// Bumped on every change, so `wait_for_grant` re-reads instead of polling.
    changed: watch::Sender<u64>,
    /// Every `cancel_request(session, request, release_if_granted)` asked.
    pub cancels: Mutex<Vec<(String, u64, bool)>>,
    /// When set, the next cancel finds the request granted first (a hand-off that raced it).
    pub grant_before_cancel: Mutex<bool>,
    /// How long each `keep_alive` takes (to see the batch's concurrency).
    pub keep_alive_delay: Mutex<Duration>,
    in_flight: AtomicUsize,
    /// Most `keep_alive`s seen running at once.
    pub in_flight_max: AtomicUsize,
    /// Calls that reached the store.
    pub calls: AtomicUsize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            table: Mutex::default(),
            changed: watch::channel(0).0,
            cancels: Mutex::default(),
            grant_before_cancel: Mutex::new(false),
            keep_alive_delay: Mutex::new(Duration::ZERO),
            in_flight: AtomicUsize::new(0),
            in_flight_max: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
        }
    }
}

fn unknown_session(session_id: &str) -> LockError {
    LockError::invalid(format!("session {session_id:?} does not exist"))
}

impl Table {
    fn handle(&mut self, key: &str, session_id: &str, ttl: Duration) -> LockHandle {
        self.next_token += 1;
        LockHandle {
            key: key.to_owned(),
            owner_id: self.sessions[session_id].0.clone(),
            session_id: session_id.to_owned(),
            fencing_token: self.next_token,
            ttl,
            client_deadline: Instant::now() + ttl,
            server_expiry: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000) + ttl,
        }
    }

    /// Grants a free `key` to its first waiter, in the same step as whatever freed it.
    fn hand_off(&mut self, key: &str) {
        if self.grants.contains_key(key) {
            return;
        }
        let Some((request, ttl)) = self.queues.get_mut(key).and_then(VecDeque::pop_front) else {
            return;
        };
        let handle = self.handle(key, &request.0, ttl);
        self.grants
            .insert(key.to_owned(), (request.clone(), handle.clone()));
        self.requests.insert(request, RequestState::Granted(handle));
    }

    fn withdraw(&mut self, key: &str, request: &RequestId) -> bool {
        let Some(queue) = self.queues.get_mut(key) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|(r, _)| r != request);
        before != queue.len()
    }
}

impl MemoryStore {
    fn touch(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }

    fn changed(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// The state of a request, if remembered.
    pub fn request(&self, session_id: &str, request_id: u64) -> Option<RequestState> {
        let t = self.table.lock().unwrap();
        t.requests
            .get(&(session_id.to_owned(), request_id))
            .cloned()
    }

    /// How many requests wait for `key`.
    pub fn queued(&self, key: &str) -> usize {
        let t = self.table.lock().unwrap();
        t.queues.get(key).map_or(0, VecDeque::len)
    }

    /// The holder of `key`'s token.
    pub fn holder_token(&self, key: &str) -> Option<u64> {
        let t = self.table.lock().unwrap();
        t.grants.get(key).map(|(_, h)| h.fencing_token)
    }
}

impl LockStore for MemoryStore {
    async fn try_insert(
        &self,
        _key: &str,
        _owner_id: &str,
        _session_id: &str,
        _ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        unreachable!("the stateless backend acquires through acquire_request")
    }

    async fn extend(
        &self,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.touch();
        let mut t = self.table.lock().unwrap();
        Ok(t.grants
            .get_mut(key)
            .filter(|(_, h)| h.fencing_token == fencing_token)
            .map(|(_, h)| {
                h.ttl = ttl;
                h.clone()
            }))
    }

    async fn delete_if_owner(&self, _key: &str, _fencing_token: u64) -> Result<bool, LockError> {
        unreachable!("the stateless backend releases through release_request")
    }

    async fn read(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.touch();
        let t = self.table.lock().unwrap();
        Ok(t.grants.get(key).map(|(_, h)| LockInfo {
            key: h.key.clone(),
            owner_id: h.owner_id.clone(),
            session_id: h.session_id.clone(),
            fencing_token: h.fencing_token,
            acquired_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000),
            expires_at: h.server_expiry,
            waiter_count: t.queues.get(key).map_or(0, |q| q.len() as u32),
        }))
    }

    async fn revoke(
        &self,
        _key: &str,
        _operator: &str,
        _reason: &str,
    ) -> Result<LockOutcome, LockError> {
        unreachable!("the stateless backend revokes through revoke_request")
    }

    async fn reap_expired(&self, _now: SystemTime) -> Result<usize, LockError> {
        self.touch();
        Ok(0)
    }

    fn backend_id(&self) -> &'static str {
        "memory"
    }
}

impl SessionRegistry for MemoryStore {
    async fn open_session(&self, owner_id: &str, ttl: Duration) -> Result<String, LockError> {
        Ok(self.open_session_with_ttl(owner_id, ttl).await?.0)
    }

    async fn heartbeat(&self, session_id: &str, _ttl: Duration) -> Result<bool, LockError> {
        Ok(self.keep_alive(session_id).await?.is_some())
    }

    async fn close_session(&self, session_id: &str) -> Result<usize, LockError> {
        self.touch();
        let mut t = self.table.lock().unwrap();
        t.principals.remove(session_id);
        if t.sessions.remove(session_id).is_none() {
            return Ok(0);
        }
        let held: Vec<String> = t
            .grants
            .iter()
            .filter(|(_, (_, h))| h.session_id == session_id)
            .map(|(k, _)| k.clone())
            .collect();
        for queue in t.queues.values_mut() {
            queue.retain(|((s, _), _)| s != session_id);
        }
        for key in &held {
            t.grants.remove(key);
            t.hand_off(key);
        }
        drop(t);
        self.changed();
        Ok(held.len())
    }

    async fn locks_of(&self, session_id: &str) -> Result<BTreeSet<String>, LockError> {
        self.touch();
        let t = self.table.lock().unwrap();
        Ok(t.grants
            .iter()
            .filter(|(_, (_, h))| h.session_id == session_id)
            .map(|(k, _)| k.clone())
            .collect())
    }
}

impl RequestStore for MemoryStore {
    /// Keeps TTLs in whole seconds, rounding up, as etcd does.
    async fn open_session_with_ttl(
        &self,
        owner_id: &str,
        ttl: Duration,
    ) -> Result<(String, Duration), LockError> {
        self.touch();
        let kept = Duration::from_secs(ttl.as_millis().div_ceil(1_000) as u64);
        let mut t = self.table.lock().unwrap();
        t.next_session += 1;
        let id = format!("s{}", t.next_session);
        t.sessions.insert(id.clone(), (owner_id.to_owned(), kept));
        Ok((id, kept))
    }

    async fn open_bound_session(
        &self,
        owner_id: &str,
        ttl: Duration,
        principal: &str,
    ) -> Result<(String, Duration), LockError> {
        let (id, kept) = self.open_session_with_ttl(owner_id, ttl).await?;
        let mut t = self.table.lock().unwrap();
        t.principals.insert(id.clone(), principal.to_owned());
        Ok((id, kept))
    }

    async fn session_principal(&self, session_id: &str) -> Result<Option<String>, LockError> {
        self.touch();
        let t = self.table.lock().unwrap();
        Ok(t.sessions
            .contains_key(session_id)
            .then(|| t.principals.get(session_id).cloned())
            .flatten())
    }

    async fn keep_alive(&self, session_id: &str) -> Result<Option<Duration>, LockError> {
        self.touch();
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight_max.fetch_max(now, Ordering::SeqCst);
        let delay = *self.keep_alive_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let t = self.table.lock().unwrap();
        Ok(t.sessions.get(session_id).map(|(_, ttl)| *ttl))
    }

    async fn acquire_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Acquired, LockError> {
        self.touch();
        let mut t = self.table.lock().unwrap();
        if !t.sessions.contains_key(session_id) {
            return Err(unknown_session(session_id));
        }
        let request = (session_id.to_owned(), request_id);
        if let Some(state) = t.requests.get(&request) {
            return Ok(match state {
                RequestState::Waiting => Acquired::Queued,
                RequestState::Granted(h) => Acquired::Granted(h.clone()),
                RequestState::NotGranted => Acquired::NotGranted,
            });
        }
        let queued = t.queues.get(key).is_some_and(|q| !q.is_empty());
        let held_by_me = t
            .grants
            .get(key)
            .is_some_and(|(_, h)| h.session_id == session_id);
        let state = if !t.grants.contains_key(key) && !queued {
            let handle = t.handle(key, session_id, ttl);
            t.grants
                .insert(key.to_owned(), (request.clone(), handle.clone()));
            RequestState::Granted(handle)
        } else if wait.is_zero() || held_by_me {
            RequestState::NotGranted
        } else {
            t.queues
                .entry(key.to_owned())
                .or_default()
                .push_back((request.clone(), ttl));
            RequestState::Waiting
        };
        t.requests.insert(request, state.clone());
        drop(t);
        self.changed();
        Ok(match state {
            RequestState::Waiting => Acquired::Queued,
            RequestState::Granted(h) => Acquired::Granted(h),
            RequestState::NotGranted => Acquired::NotGranted,
        })
    }

    async fn wait_for_grant(
        &self,
        session_id: &str,
        request_id: u64,
        _key: &str,
    ) -> Result<Option<LockHandle>, LockError> {
        self.touch();
        let mut changed = self.changed.subscribe();
        loop {
            match self.request(session_id, request_id) {
                Some(RequestState::Granted(h)) => return Ok(Some(h)),
                Some(RequestState::Waiting) => {}
                Some(RequestState::NotGranted) | None => return Ok(None),
            }
            changed
                .changed()
                .await
                .map_err(|_| LockError::contention("store gone"))?;
        }
    }

    async fn cancel_request(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        release_if_granted: bool,
    ) -> Result<Cancelled, LockError> {
        self.touch();
        self.cancels
            .lock()
            .unwrap()
            .push((session_id.to_owned(), request_id, release_if_granted));
        let request = (session_id.to_owned(), request_id);
        let mut t = self.table.lock().unwrap();
        if std::mem::take(&mut *self.grant_before_cancel.lock().unwrap()) {
            // The holder lets go just before the cancel lands: the hand-off wins the race.
            let holder = t.grants.get(key).map(|(r, _)| r.clone());
            if let Some(holder) = holder {
                t.grants.remove(key);
                t.requests.insert(holder, RequestState::NotGranted);
            }
            t.hand_off(key);
        }
        let cancelled = match t.requests.get(&request).cloned() {
            Some(RequestState::Waiting) => {
                t.withdraw(key, &request);
                t.requests.insert(request, RequestState::NotGranted);
                Cancelled {
                    grant: None,
                    released: false,
                }
            }
            Some(RequestState::Granted(_)) if release_if_granted => {
                t.grants.remove(key);
                t.requests.insert(request, RequestState::NotGranted);
                t.hand_off(key);
                Cancelled {
                    grant: None,
                    released: true,
                }
            }
            Some(RequestState::Granted(h)) => Cancelled {
                grant: Some(h),
                released: false,
            },
            Some(RequestState::NotGranted) | None => Cancelled {
                grant: None,
                released: false,
            },
        };
        drop(t);
        self.changed();
        Ok(cancelled)
    }

    async fn release_request(
        &self,
        _session_id: &str,
        _request_id: u64,
        key: &str,
        fencing_token: u64,
    ) -> Result<bool, LockError> {
        self.touch();
        let mut t = self.table.lock().unwrap();
        if t.grants
            .get(key)
            .is_none_or(|(_, h)| h.fencing_token != fencing_token)
        {
            return Ok(false);
        }
        t.grants.remove(key);
        t.hand_off(key);
        drop(t);
        self.changed();
        Ok(true)
    }

    async fn revoke_request(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> Result<LockOutcome, LockError> {
        self.touch();
        let mut t = self.table.lock().unwrap();
        let previous = t.grants.remove(key).map(|(_, h)| h);
        t.next_token += 1;
        let floor = t.next_token;
        let record = RevocationRecord {
            key: key.to_owned(),
            operator: operator.to_owned(),
            reason: reason.to_owned(),
            previous_owner_id: previous.as_ref().map(|h| h.owner_id.clone()),
            previous_token: previous.as_ref().map(|h| h.fencing_token),
            new_token_floor: floor,
            revoked_at: SystemTime::UNIX_EPOCH + Duration::from_secs(2_000),
            request_id,
        };
        t.revocations.push_back(record);
        while t.revocations.len() > AUDIT_LOG_MAX {
            t.revocations.pop_front();
        }
        t.hand_off(key);
        drop(t);
        self.changed();
        Ok(LockOutcome {
            key: key.to_owned(),
            revoked: previous.is_some(),
            previous_owner_id: previous.as_ref().map(|h| h.owner_id.clone()),
            previous_token: previous.map(|h| h.fencing_token),
            new_token_floor: floor,
        })
    }

    async fn revocations(
        &self,
        key: Option<&str>,
        before_floor: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RevocationRecord>, LockError> {
        self.touch();
        let t = self.table.lock().unwrap();
        Ok(t.revocations
            .iter()
            .rev()
            .filter(|r| before_floor.is_none_or(|before| r.new_token_floor < before))
            .filter(|r| key.is_none_or(|key| r.key == key))
            .take(limit)
            .cloned()
            .collect())
    }
}
