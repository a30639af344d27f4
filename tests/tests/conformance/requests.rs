//! The `RequestStore` conformance cases (issue 18): lock_api::request_store's rules — request-id
//! idempotency, the FIFO queue and its hand-off, cancellation, wait deadlines and the Raft
//! state machine's bounds — as executable checks, generic over the backend, so every store the
//! one serving layer runs on is shown to meet clients alike.
//!
//! Owns the cases only; each `t60_conformance_*.rs` builds its store and calls
//! [`run_request_suite`]. Keys carry the run's nonce, as in the C2 cases. Where a rule is about a
//! hand-off, the cases assert it from the store's own answers (`read` right after the freeing
//! call returns shows the next holder: the hand-off was in the same step), never from timing.

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use lock_api::limits::MAX_WAIT_MAX;
use lock_api::{Acquired, Cancelled, LockError, LockHandle, RequestStore};
use lock_raft_store::limits::{LOCKS_PER_SESSION_MAX, WAITERS_PER_KEY_MAX, WAITS_PER_SESSION_MAX};

use super::{Cut, EXPIRY_WAIT_MAX, LOCK_TTL_LONG, POLL_INTERVAL, SESSION_TTL_LONG, TTL_SHORT};

/// How long a server-side wait may last in the cases that must not run into it.
pub const WAIT_LONG: Duration = Duration::from_secs(60);
/// The wait of a waiter whose deadline the case lets pass.
pub const WAIT_SHORT: Duration = Duration::from_secs(1);
/// How long a case lets a woken waiter take to learn its outcome before failing: generous, so
/// a slow machine never fails a correct backend; a lost wake-up still fails it.
pub const WAKE_WAIT_MAX: Duration = Duration::from_secs(15);
/// Waiters in the FIFO case.
pub const FIFO_WAITERS: usize = 5;
/// Rounds of the cancel-versus-hand-off race.
pub const CANCEL_RACE_ROUNDS: usize = 5;
/// Session and grant lease in the bound cases, which make a thousand grants or waiters and may
/// take longer than [`SESSION_TTL_LONG`] on a loaded machine.
pub const BOUND_TTL: Duration = Duration::from_secs(10 * 60);
/// Calls in flight at once while a bound case fills a limit.
pub const BOUND_PARALLEL: usize = 8;

/// docs/SECURITY.md §3 at the store: a session opened bound answers its principal for as long
/// as it lives, an unbound one answers none, and an ended or unknown one answers none (its id
/// is never reused, so the node's check-then-act cannot be fooled by a new session).
async fn a_bound_session_keeps_its_principal_for_life<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
) {
    let principal = format!("spiffe://lockd/conformance/{}", c.nonce);
    let (bound, _) = c
        .store
        .open_bound_session("bound-owner", SESSION_TTL_LONG, &principal)
        .await
        .expect("open_bound_session");
    let unbound = c.session("unbound-owner").await;
    let of = |id: String| {
        let store = c.store.clone();
        async move {
            store
                .session_principal(&id)
                .await
                .expect("session_principal")
        }
    };
    assert_eq!(of(bound.clone()).await.as_deref(), Some(principal.as_str()));
    assert_eq!(of(unbound.clone()).await, None);
    assert_eq!(
        of(format!("{}-never-opened", c.nonce)
            .chars()
            .take(60)
            .collect())
        .await,
        None
    );
    // A heartbeat and a grant change nothing of it.
    assert!(
        c.store
            .keep_alive(&bound)
            .await
            .expect("keep_alive")
            .is_some()
    );
    let key = c.key("bound", 0);
    assert!(matches!(
        c.acquire(&bound, 1, &key, Duration::ZERO).await,
        Acquired::Granted(_)
    ));
    assert_eq!(of(bound.clone()).await.as_deref(), Some(principal.as_str()));
    assert_eq!(c.store.close_session(&bound).await.expect("close"), 1);
    assert_eq!(of(bound).await, None, "an ended session is bound to nobody");
    c.store.close_session(&unbound).await.expect("close");
}

/// What a backend declares to the request cases.
pub struct RequestBackend<S> {
    /// The store under test.
    pub store: S,
    /// Breaks the store's notification channel (PostgreSQL: terminates its `LISTEN`
    /// connection) and resolves once the store has noticed; `None` if the backend has none.
    pub break_notifications: Option<Cut>,
}

struct RCtx<S> {
    store: S,
    nonce: String,
}

impl<S: RequestStore + Clone + 'static> RCtx<S> {
    fn key(&self, case: &str, n: usize) -> String {
        format!("conf/{}/req/{case}/{n}", self.nonce)
    }

    async fn session(&self, owner: &str) -> String {
        self.store
            .open_session_with_ttl(owner, SESSION_TTL_LONG)
            .await
            .unwrap_or_else(|e| panic!("open_session_with_ttl({owner}): {e}"))
            .0
    }

    async fn acquire(&self, s: &str, rid: u64, key: &str, wait: Duration) -> Acquired {
        self.store
            .acquire_request(s, rid, key, LOCK_TTL_LONG, wait)
            .await
            .unwrap_or_else(|e| panic!("acquire_request({s}, {rid}, {key}): {e}"))
    }

    async fn granted(&self, s: &str, rid: u64, key: &str) -> LockHandle {
        match self.acquire(s, rid, key, Duration::ZERO).await {
            Acquired::Granted(h) => h,
            other => panic!("acquire_request({key}) on a free key answered {other:?}"),
        }
    }

    async fn queued(&self, s: &str, rid: u64, key: &str, wait: Duration) {
        let answer = self.acquire(s, rid, key, wait).await;
        assert_eq!(
            answer,
            Acquired::Queued,
            "acquire {rid} of {s} on held {key}"
        );
    }

    /// The session holding `key` now, and its token.
    async fn holder(&self, key: &str) -> Option<(String, u64)> {
        self.store
            .read(key)
            .await
            .expect("read")
            .map(|i| (i.session_id, i.fencing_token))
    }

    async fn waiters(&self, key: &str) -> u32 {
        self.store
            .read(key)
            .await
            .expect("read")
            .map_or(0, |i| i.waiter_count)
    }

    /// Starts waiting for `(s, rid)` on `key` in a task of its own.
    fn wait(
        &self,
        s: &str,
        rid: u64,
        key: &str,
    ) -> tokio::task::JoinHandle<Result<Option<LockHandle>, LockError>> {
        let store = self.store.clone();
        let (s, key) = (s.to_owned(), key.to_owned());
        tokio::spawn(async move { store.wait_for_grant(&s, rid, &key).await })
    }
}

/// The outcome of a wait the case is entitled to, failing the case if it does not come.
async fn outcome(
    what: &str,
    wait: tokio::task::JoinHandle<Result<Option<LockHandle>, LockError>>,
) -> Option<LockHandle> {
    tokio::time::timeout(WAKE_WAIT_MAX, wait)
        .await
        .unwrap_or_else(|_| panic!("{what}: no outcome within {WAKE_WAIT_MAX:?}"))
        .expect("wait task")
        .unwrap_or_else(|e| panic!("{what}: wait_for_grant failed: {e}"))
}

/// Polls `done` (a store read) until it holds, calling `reap_expired` between tries, for the
/// cases where time must pass for the store.
async fn reap_until<S, F, Fut>(c: &RCtx<S>, what: &str, mut done: F)
where
    S: RequestStore + Clone + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + EXPIRY_WAIT_MAX;
    loop {
        if done().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {EXPIRY_WAIT_MAX:?}"
        );
        c.store
            .reap_expired(SystemTime::now())
            .await
            .expect("reap_expired");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Runs every request case against `backend`, printing each as it passes; returns how many ran.
pub async fn run_request_suite<S>(name: &str, backend: RequestBackend<S>) -> usize
where
    S: RequestStore + Clone + 'static,
{
    let started = Instant::now();
    let c = RCtx {
        store: backend.store,
        nonce: super::run_nonce(),
    };
    let mut ran = 0;
    macro_rules! case {
        ($f:ident) => {{
            let t = Instant::now();
            $f(&c).await;
            ran += 1;
            println!(
                "requests[{name}] {} ok ({} ms)",
                stringify!($f),
                t.elapsed().as_millis()
            );
        }};
    }
    case!(sessions_keep_their_own_ttl);
    case!(a_bound_session_keeps_its_principal_for_life);
    case!(an_ended_session_is_refused_or_answered_empty);
    case!(five_waiters_are_served_in_arrival_order);
    case!(release_hands_off_in_the_same_step);
    case!(revoke_hands_off_in_the_same_step);
    case!(close_session_hands_off_in_the_same_step);
    case!(an_expired_grant_is_handed_off_by_the_reaper);
    case!(an_expired_session_hands_off_its_keys);
    case!(a_retried_acquire_is_granted_once);
    case!(a_retried_queued_acquire_stays_one_waiter);
    case!(a_retried_release_never_deletes_a_later_grant);
    case!(a_retried_revoke_is_answered_not_repeated);
    case!(cancel_withdraws_a_waiter_or_keeps_a_grant);
    case!(cancel_with_release_frees_a_grant_once);
    case!(cancel_racing_a_hand_off_releases_exactly_once);
    case!(an_acquire_after_its_own_cancel_does_nothing);
    case!(a_lapsed_wait_is_dropped_and_the_next_waiter_served);
    case!(acquires_are_not_reentrant);
    case!(a_new_acquire_never_overtakes_a_waiter);
    case!(waits_per_session_are_bounded);
    case!(waiters_per_key_are_bounded);
    case!(locks_per_session_are_bounded);
    if let Some(cut) = backend.break_notifications {
        let t = Instant::now();
        a_lost_notification_channel_loses_no_hand_off(&c, cut).await;
        ran += 1;
        println!(
            "requests[{name}] a_lost_notification_channel_loses_no_hand_off ok ({} ms)",
            t.elapsed().as_millis()
        );
    } else {
        println!("requests[{name}] a_lost_notification_channel_loses_no_hand_off: no channel");
    }
    println!(
        "requests[{name}]: {ran} cases passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    ran
}

async fn sessions_keep_their_own_ttl<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let (s, ttl) = c
        .store
        .open_session_with_ttl("owner-a", SESSION_TTL_LONG)
        .await
        .expect("open");
    assert!(
        ttl >= SESSION_TTL_LONG,
        "kept {ttl:?}, asked {SESSION_TTL_LONG:?}"
    );
    assert_eq!(c.store.keep_alive(&s).await, Ok(Some(ttl)));
    assert_eq!(
        c.store.keep_alive(&s).await,
        Ok(Some(ttl)),
        "renews by the same"
    );
    assert_eq!(c.store.close_session(&s).await, Ok(0));
    assert_eq!(c.store.keep_alive(&s).await, Ok(None), "terminal");
    assert_eq!(c.store.keep_alive(&s).await, Ok(None), "still terminal");
}

async fn an_ended_session_is_refused_or_answered_empty<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
) {
    let key = c.key("ended", 0);
    let s = c.session("owner-a").await;
    let h = c.granted(&s, 1, &key).await;
    assert_eq!(c.store.close_session(&s).await, Ok(1));
    match c
        .store
        .acquire_request(&s, 2, &key, LOCK_TTL_LONG, WAIT_LONG)
        .await
    {
        Err(LockError::InvalidArgument { .. }) => {}
        other => panic!("acquire on an ended session must be InvalidArgument, got {other:?}"),
    }
    assert_eq!(
        c.store.release_request(&s, 3, &key, h.fencing_token).await,
        Ok(false),
        "an ended session's grants ended with it"
    );
    assert_eq!(
        c.store.cancel_request(&s, 1, &key, true).await,
        Ok(Cancelled {
            grant: None,
            released: false
        })
    );
    match c
        .store
        .acquire_request(&s, 0, &key, LOCK_TTL_LONG, WAIT_LONG)
        .await
    {
        Err(LockError::InvalidArgument { .. }) => {}
        other => panic!("request id 0 must be InvalidArgument, got {other:?}"),
    }
    assert_eq!(c.store.read(&key).await, Ok(None));
}

async fn five_waiters_are_served_in_arrival_order<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("fifo", 0);
    let holder = c.session("holder").await;
    let first = c.granted(&holder, 1, &key).await;
    let mut sessions = Vec::new();
    let mut waits = Vec::new();
    for n in 0..FIFO_WAITERS {
        let s = c.session(&format!("waiter-{n}")).await;
        c.queued(&s, 10 + n as u64, &key, WAIT_LONG).await;
        assert_eq!(c.waiters(&key).await, n as u32 + 1, "waiter_count");
        waits.push(c.wait(&s, 10 + n as u64, &key));
        sessions.push(s);
    }
    // Each release hands the key to the next waiter in arrival order, within the release
    // itself: `read` right after it shows the new holder, and nobody polled for it.
    let mut previous = (holder.clone(), first.fencing_token);
    for (n, wait) in waits.into_iter().enumerate() {
        let (from, token) = previous.clone();
        assert!(
            c.store
                .release_request(&from, 100 + n as u64, &key, token)
                .await
                .expect("release")
        );
        let (now_holder, now_token) = c.holder(&key).await.expect("handed off, not freed");
        assert_eq!(
            now_holder, sessions[n],
            "waiter {n} is next in arrival order"
        );
        assert!(now_token > token, "tokens grow in grant order");
        assert_eq!(
            c.waiters(&key).await,
            (FIFO_WAITERS - n - 1) as u32,
            "the granted waiter left the queue"
        );
        let h = outcome(&format!("waiter {n}"), wait)
            .await
            .unwrap_or_else(|| panic!("waiter {n} was not granted"));
        assert_eq!(h.fencing_token, now_token);
        assert_eq!(h.session_id, sessions[n]);
        assert_eq!(h.owner_id, format!("waiter-{n}"));
        assert_eq!(h.key, key);
        previous = (sessions[n].clone(), now_token);
    }
    let (last, token) = previous;
    assert!(
        c.store
            .release_request(&last, 200, &key, token)
            .await
            .expect("release")
    );
    assert_eq!(
        c.store.read(&key).await,
        Ok(None),
        "an empty queue frees the key"
    );
    for s in sessions.iter().chain([&holder]) {
        c.store.close_session(s).await.expect("close");
    }
}

/// A holder, one waiter queued behind it and its wait started: the setting of each hand-off
/// case. Returns (holder session, holder's grant, waiter session, the wait).
async fn holder_and_waiter<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
    key: &str,
    holder_ttl: Duration,
    holder_session_ttl: Duration,
) -> (
    String,
    LockHandle,
    String,
    tokio::task::JoinHandle<Result<Option<LockHandle>, LockError>>,
) {
    let (holder, _) = c
        .store
        .open_session_with_ttl("holder", holder_session_ttl)
        .await
        .expect("open holder");
    let h = match c
        .store
        .acquire_request(&holder, 1, key, holder_ttl, Duration::ZERO)
        .await
        .expect("acquire")
    {
        Acquired::Granted(h) => h,
        other => panic!("a free key answered {other:?}"),
    };
    let waiter = c.session("waiter").await;
    c.queued(&waiter, 1, key, WAIT_LONG).await;
    let wait = c.wait(&waiter, 1, key);
    (holder, h, waiter, wait)
}

/// The waiter got the key: its wait says so, with the token `read` shows.
async fn handed_to<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
    what: &str,
    key: &str,
    waiter: &str,
    wait: tokio::task::JoinHandle<Result<Option<LockHandle>, LockError>>,
    after: u64,
) {
    let h = outcome(what, wait)
        .await
        .unwrap_or_else(|| panic!("{what}: the waiter was not granted"));
    assert_eq!(h.session_id, waiter);
    assert!(h.fencing_token > after, "{what}: token after the freed one");
    assert_eq!(
        c.holder(key).await,
        Some((waiter.to_owned(), h.fencing_token)),
        "{what}"
    );
}

async fn release_hands_off_in_the_same_step<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("handoff-release", 0);
    let (holder, h, waiter, wait) =
        holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
    assert_eq!(
        c.store
            .release_request(&holder, 2, &key, h.fencing_token)
            .await,
        Ok(true)
    );
    assert_eq!(c.holder(&key).await.map(|x| x.0), Some(waiter.clone()));
    handed_to(c, "release", &key, &waiter, wait, h.fencing_token).await;
    c.store.close_session(&holder).await.expect("close");
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}

async fn revoke_hands_off_in_the_same_step<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("handoff-revoke", 0);
    let (holder, h, waiter, wait) =
        holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
    let out = c
        .store
        .revoke_request(&key, "oncall", "drill", 0)
        .await
        .expect("revoke");
    assert!(out.revoked);
    assert_eq!(out.previous_token, Some(h.fencing_token));
    let (now_holder, token) = c.holder(&key).await.expect("handed off");
    assert_eq!(now_holder, waiter);
    assert!(
        token > out.new_token_floor,
        "the hand-off's token is above the floor"
    );
    handed_to(c, "revoke", &key, &waiter, wait, out.new_token_floor).await;
    assert_eq!(c.store.close_session(&holder).await, Ok(0));
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}

async fn close_session_hands_off_in_the_same_step<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("handoff-close", 0);
    let (holder, h, waiter, wait) =
        holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
    assert_eq!(c.store.close_session(&holder).await, Ok(1));
    assert_eq!(c.holder(&key).await.map(|x| x.0), Some(waiter.clone()));
    handed_to(c, "close_session", &key, &waiter, wait, h.fencing_token).await;
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}

async fn an_expired_grant_is_handed_off_by_the_reaper<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
) {
    let key = c.key("handoff-expiry", 0);
    let (holder, h, waiter, wait) = holder_and_waiter(c, &key, TTL_SHORT, SESSION_TTL_LONG).await;
    reap_until(c, "the expired grant's hand-off", || async {
        c.holder(&key).await.is_some_and(|(s, _)| s == waiter)
    })
    .await;
    handed_to(c, "expiry", &key, &waiter, wait, h.fencing_token).await;
    assert_eq!(
        c.store.extend(&key, h.fencing_token, LOCK_TTL_LONG).await,
        Ok(None),
        "the expired grant is lost"
    );
    c.store.close_session(&holder).await.expect("close");
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}

async fn an_expired_session_hands_off_its_keys<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("handoff-session", 0);
    // The grant's own lease is long; the holder's session, never kept alive, is short.
    let (holder, h, waiter, wait) = holder_and_waiter(c, &key, LOCK_TTL_LONG, TTL_SHORT).await;
    reap_until(c, "the expired session's hand-off", || async {
        c.holder(&key).await.is_some_and(|(s, _)| s == waiter)
    })
    .await;
    handed_to(c, "session expiry", &key, &waiter, wait, h.fencing_token).await;
    assert_eq!(c.store.keep_alive(&holder).await, Ok(None));
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}

async fn a_retried_acquire_is_granted_once<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("retry-acquire", 0);
    let s = c.session("owner-a").await;
    let h = c.granted(&s, 7, &key).await;
    // The retry (a lost answer) gets the same grant, not a second one, and not NotGranted for
    // "already held by this session".
    for _ in 0..2 {
        match c.acquire(&s, 7, &key, WAIT_LONG).await {
            Acquired::Granted(again) => {
                assert_eq!(again.fencing_token, h.fencing_token);
                assert_eq!(again.key, key);
                assert!(again.client_deadline <= Instant::now() + LOCK_TTL_LONG);
            }
            other => panic!("a retried granted acquire answered {other:?}"),
        }
    }
    assert_eq!(c.holder(&key).await, Some((s.clone(), h.fencing_token)));
    assert_eq!(c.waiters(&key).await, 0, "the retry did not queue");
    assert_eq!(c.store.close_session(&s).await, Ok(1));
}

async fn a_retried_queued_acquire_stays_one_waiter<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("retry-queued", 0);
    let (holder, h, waiter, wait) =
        holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
    for _ in 0..3 {
        assert_eq!(
            c.acquire(&waiter, 1, &key, WAIT_LONG).await,
            Acquired::Queued
        );
    }
    assert_eq!(
        c.waiters(&key).await,
        1,
        "one queue entry, however often retried"
    );
    assert!(
        c.store
            .release_request(&holder, 2, &key, h.fencing_token)
            .await
            .expect("release")
    );
    handed_to(c, "retried queued", &key, &waiter, wait, h.fencing_token).await;
    // And once granted, the retry answers the grant.
    let token = c.holder(&key).await.expect("held").1;
    match c.acquire(&waiter, 1, &key, WAIT_LONG).await {
        Acquired::Granted(g) => assert_eq!(g.fencing_token, token),
        other => panic!("a granted retry answered {other:?}"),
    }
    c.store.close_session(&holder).await.expect("close");
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}

async fn a_retried_release_never_deletes_a_later_grant<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
) {
    let key = c.key("retry-release", 0);
    let a = c.session("owner-a").await;
    let b = c.session("owner-b").await;
    let h = c.granted(&a, 1, &key).await;
    assert_eq!(
        c.store.release_request(&a, 2, &key, h.fencing_token).await,
        Ok(true)
    );
    let later = c.granted(&b, 1, &key).await;
    // The retry answers its first answer and does not touch b's grant.
    assert_eq!(
        c.store.release_request(&a, 2, &key, h.fencing_token).await,
        Ok(true)
    );
    assert_eq!(c.holder(&key).await, Some((b.clone(), later.fencing_token)));
    // A release of a grant that no longer matches is false, and stays false on retry.
    assert_eq!(
        c.store.release_request(&a, 3, &key, h.fencing_token).await,
        Ok(false)
    );
    assert_eq!(
        c.store.release_request(&a, 3, &key, h.fencing_token).await,
        Ok(false)
    );
    assert_eq!(c.holder(&key).await, Some((b.clone(), later.fencing_token)));
    assert_eq!(c.store.close_session(&a).await, Ok(0));
    assert_eq!(c.store.close_session(&b).await, Ok(1));
}

async fn a_retried_revoke_is_answered_not_repeated<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("retry-revoke", 0);
    let (holder, h, waiter, wait) =
        holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
    let first = c
        .store
        .revoke_request(&key, "oncall", "drill", 77)
        .await
        .expect("revoke");
    assert_eq!(first.previous_token, Some(h.fencing_token));
    handed_to(c, "revoke", &key, &waiter, wait, first.new_token_floor).await;
    let next = c.holder(&key).await.expect("held by the waiter");
    // The retry answers the first outcome and leaves the next holder alone.
    let retry = c
        .store
        .revoke_request(&key, "oncall", "drill", 77)
        .await
        .expect("revoke retry");
    assert_eq!(retry, first);
    assert_eq!(c.holder(&key).await, Some(next.clone()));
    // Another operator's revoke with the same id is a revoke of its own.
    let other = c
        .store
        .revoke_request(&key, "someone-else", "drill", 77)
        .await
        .expect("revoke");
    assert!(other.revoked);
    assert_eq!(other.previous_token, Some(next.1));
    // Id 0 is never deduplicated: two revokes, two floors.
    let z1 = c
        .store
        .revoke_request(&key, "oncall", "a", 0)
        .await
        .expect("revoke");
    let z2 = c
        .store
        .revoke_request(&key, "oncall", "a", 0)
        .await
        .expect("revoke");
    assert!(z2.new_token_floor > z1.new_token_floor);
    assert_eq!(c.store.close_session(&holder).await, Ok(0));
    assert_eq!(c.store.close_session(&waiter).await, Ok(0));
}

async fn cancel_withdraws_a_waiter_or_keeps_a_grant<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
) {
    let key = c.key("cancel-keep", 0);
    let (holder, h, waiter, wait) =
        holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
    let withdrawn = Cancelled {
        grant: None,
        released: false,
    };
    assert_eq!(
        c.store.cancel_request(&waiter, 1, &key, false).await,
        Ok(withdrawn.clone())
    );
    assert_eq!(
        outcome("cancelled wait", wait).await,
        None,
        "the wait ends ungranted"
    );
    assert_eq!(c.waiters(&key).await, 0, "withdrawn from the queue");
    assert_eq!(
        c.store.cancel_request(&waiter, 1, &key, false).await,
        Ok(withdrawn),
        "a retried cancel answers alike"
    );
    assert_eq!(
        c.acquire(&waiter, 1, &key, WAIT_LONG).await,
        Acquired::NotGranted
    );
    // A granted request cancelled without release keeps its grant and is told it.
    assert_eq!(
        c.store
            .release_request(&holder, 2, &key, h.fencing_token)
            .await,
        Ok(true)
    );
    assert_eq!(
        c.store.read(&key).await,
        Ok(None),
        "the withdrawn waiter got nothing"
    );
    let mine = c.granted(&waiter, 2, &key).await;
    let kept = c
        .store
        .cancel_request(&waiter, 2, &key, false)
        .await
        .expect("cancel");
    assert!(!kept.released);
    assert_eq!(
        kept.grant.map(|g| g.fencing_token),
        Some(mine.fencing_token)
    );
    assert_eq!(
        c.holder(&key).await,
        Some((waiter.clone(), mine.fencing_token))
    );
    c.store.close_session(&holder).await.expect("close");
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}

async fn cancel_with_release_frees_a_grant_once<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("cancel-release", 0);
    let (holder, h, waiter, wait) =
        holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
    let third = c.session("third").await;
    c.queued(&third, 1, &key, WAIT_LONG).await;
    let third_wait = c.wait(&third, 1, &key);
    assert_eq!(
        c.store
            .release_request(&holder, 2, &key, h.fencing_token)
            .await,
        Ok(true)
    );
    handed_to(c, "release", &key, &waiter, wait, h.fencing_token).await;
    let released = Cancelled {
        grant: None,
        released: true,
    };
    // The caller went away just as the grant arrived: the cancel releases it, and the key goes
    // on to the next waiter in the same step.
    assert_eq!(
        c.store.cancel_request(&waiter, 1, &key, true).await,
        Ok(released.clone())
    );
    assert_eq!(c.holder(&key).await.map(|x| x.0), Some(third.clone()));
    let third_token = c.holder(&key).await.expect("held").1;
    assert_eq!(
        c.store.cancel_request(&waiter, 1, &key, true).await,
        Ok(released),
        "a retried cancel answers alike and releases nothing more"
    );
    assert_eq!(c.holder(&key).await, Some((third.clone(), third_token)));
    handed_to(c, "cancel", &key, &third, third_wait, h.fencing_token).await;
    c.store.close_session(&holder).await.expect("close");
    assert_eq!(c.store.close_session(&waiter).await, Ok(0));
    assert_eq!(c.store.close_session(&third).await, Ok(1));
}

async fn cancel_racing_a_hand_off_releases_exactly_once<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
) {
    for round in 0..CANCEL_RACE_ROUNDS {
        let key = c.key("cancel-race", round);
        let (holder, h, waiter, wait) =
            holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
        let next = c.session("next").await;
        c.queued(&next, 1, &key, WAIT_LONG).await;
        let next_wait = c.wait(&next, 1, &key);
        let (released, cancelled) = tokio::join!(
            c.store.release_request(&holder, 2, &key, h.fencing_token),
            c.store.cancel_request(&waiter, 1, &key, true),
        );
        assert_eq!(released, Ok(true));
        let cancelled = cancelled.expect("cancel");
        assert_eq!(cancelled.grant, None, "release_if_granted keeps nothing");
        // Whichever came first, the waiter does not hold the key and the next waiter does:
        // withdrawn before the hand-off, or granted and released once after it.
        assert_eq!(
            c.holder(&key).await.map(|x| x.0),
            Some(next.clone()),
            "round {round}"
        );
        let waited = outcome("the cancelled waiter", wait).await;
        assert_eq!(
            waited.is_some(),
            cancelled.released,
            "round {round}: granted-then-released, or withdrawn"
        );
        handed_to(
            c,
            "the next waiter",
            &key,
            &next,
            next_wait,
            h.fencing_token,
        )
        .await;
        for s in [&holder, &waiter] {
            assert_eq!(c.store.close_session(s).await, Ok(0));
        }
        assert_eq!(c.store.close_session(&next).await, Ok(1));
    }
}

async fn an_acquire_after_its_own_cancel_does_nothing<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
) {
    let key = c.key("cancel-first", 0);
    let s = c.session("owner-a").await;
    // The cancel reached the store first (the acquire was delayed behind it).
    assert_eq!(
        c.store.cancel_request(&s, 5, &key, true).await,
        Ok(Cancelled {
            grant: None,
            released: false
        })
    );
    assert_eq!(
        c.acquire(&s, 5, &key, WAIT_LONG).await,
        Acquired::NotGranted
    );
    assert_eq!(
        c.store.read(&key).await,
        Ok(None),
        "the free key was not granted"
    );
    assert!(c.store.locks_of(&s).await.expect("locks_of").is_empty());
    assert_eq!(c.store.close_session(&s).await, Ok(0));
}

async fn a_lapsed_wait_is_dropped_and_the_next_waiter_served<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
) {
    let key = c.key("lapsed", 0);
    let holder = c.session("holder").await;
    let h = c.granted(&holder, 1, &key).await;
    let short = c.session("short").await;
    c.queued(&short, 1, &key, WAIT_SHORT).await;
    let long = c.session("long").await;
    c.queued(&long, 1, &key, WAIT_LONG).await;
    let long_wait = c.wait(&long, 1, &key);
    assert_eq!(
        outcome("the short wait", c.wait(&short, 1, &key)).await,
        None
    );
    assert_eq!(
        c.acquire(&short, 1, &key, WAIT_SHORT).await,
        Acquired::NotGranted
    );
    assert_eq!(c.waiters(&key).await, 1, "the lapsed waiter left the queue");
    assert_eq!(
        c.store
            .release_request(&holder, 2, &key, h.fencing_token)
            .await,
        Ok(true)
    );
    assert_eq!(c.holder(&key).await.map(|x| x.0), Some(long.clone()));
    handed_to(
        c,
        "after a lapsed waiter",
        &key,
        &long,
        long_wait,
        h.fencing_token,
    )
    .await;
    for s in [&holder, &short] {
        assert_eq!(c.store.close_session(s).await, Ok(0));
    }
    assert_eq!(c.store.close_session(&long).await, Ok(1));
}

async fn acquires_are_not_reentrant<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("reentrant", 0);
    let s = c.session("owner-a").await;
    let h = c.granted(&s, 1, &key).await;
    assert_eq!(
        c.acquire(&s, 2, &key, Duration::ZERO).await,
        Acquired::NotGranted
    );
    assert_eq!(
        c.acquire(&s, 3, &key, WAIT_LONG).await,
        Acquired::NotGranted,
        "waiting on oneself would end only with one's own lease"
    );
    assert_eq!(c.waiters(&key).await, 0);
    assert_eq!(c.holder(&key).await, Some((s.clone(), h.fencing_token)));
    assert_eq!(c.store.close_session(&s).await, Ok(1));
}

async fn a_new_acquire_never_overtakes_a_waiter<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("overtake", 0);
    // The holder's grant runs out with nobody reaping it: the key is free but its queue is
    // not, so it is the waiter's, not the newcomer's (nor try_insert's).
    let (holder, h, waiter, wait) = holder_and_waiter(c, &key, TTL_SHORT, SESSION_TTL_LONG).await;
    let newcomer = c.session("newcomer").await;
    let deadline = Instant::now() + EXPIRY_WAIT_MAX;
    while SystemTime::now() < h.server_expiry + super::EXPIRY_GRACE {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    assert_eq!(
        c.store
            .try_insert(&key, "newcomer", &newcomer, LOCK_TTL_LONG)
            .await,
        Ok(None),
        "try_insert does not overtake the queue"
    );
    match c.acquire(&newcomer, 1, &key, Duration::ZERO).await {
        Acquired::NotGranted => {}
        other => panic!("a newcomer overtook the waiter: {other:?}"),
    }
    handed_to(
        c,
        "the waiter before the newcomer",
        &key,
        &waiter,
        wait,
        h.fencing_token,
    )
    .await;
    c.store.close_session(&holder).await.expect("close");
    assert_eq!(c.store.close_session(&newcomer).await, Ok(0));
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}

fn is_invalid<T: std::fmt::Debug>(what: &str, r: Result<T, LockError>) {
    match r {
        Err(LockError::InvalidArgument { .. }) => {}
        other => panic!("{what} must be InvalidArgument, got {other:?}"),
    }
}

async fn waits_per_session_are_bounded<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let holder = c.session("holder").await;
    let waiter = c.session("waiter").await;
    for n in 0..=WAITS_PER_SESSION_MAX {
        c.granted(&holder, 1 + n as u64, &c.key("waits-bound", n))
            .await;
    }
    for n in 0..WAITS_PER_SESSION_MAX {
        c.queued(&waiter, 1 + n as u64, &c.key("waits-bound", n), WAIT_LONG)
            .await;
    }
    let over = c.key("waits-bound", WAITS_PER_SESSION_MAX);
    is_invalid(
        "a wait past WAITS_PER_SESSION_MAX",
        c.store
            .acquire_request(&waiter, 1000, &over, LOCK_TTL_LONG, WAIT_LONG)
            .await,
    );
    assert_eq!(
        c.waiters(&over).await,
        0,
        "the refused acquire changed nothing"
    );
    assert_eq!(c.store.close_session(&waiter).await, Ok(0));
    assert_eq!(
        c.store.close_session(&holder).await,
        Ok(WAITS_PER_SESSION_MAX + 1)
    );
}

/// Runs `f(0..n)` with at most [`BOUND_PARALLEL`] at a time; returns the results in order.
async fn fan_out<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    while start < n {
        let end = (start + BOUND_PARALLEL).min(n);
        let tasks: Vec<_> = (start..end).map(|i| tokio::spawn(f(i))).collect();
        for task in tasks {
            out.push(task.await.expect("fan-out task"));
        }
        start = end;
    }
    out
}

async fn waiters_per_key_are_bounded<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let key = c.key("waiters-bound", 0);
    let (holder, _) = c
        .store
        .open_session_with_ttl("holder", BOUND_TTL)
        .await
        .expect("open");
    let h = c
        .store
        .acquire_request(&holder, 1, &key, BOUND_TTL, Duration::ZERO)
        .await
        .expect("acquire");
    assert!(matches!(h, Acquired::Granted(_)), "{h:?}");
    let sessions = fan_out(WAITERS_PER_KEY_MAX, |n| {
        let (store, key) = (c.store.clone(), key.clone());
        async move {
            let (s, _) = store
                .open_session_with_ttl(&format!("w{n}"), BOUND_TTL)
                .await
                .expect("open");
            let queued = store
                .acquire_request(&s, 1, &key, LOCK_TTL_LONG, MAX_WAIT_MAX)
                .await
                .expect("acquire");
            assert_eq!(queued, Acquired::Queued, "waiter {n}");
            s
        }
    })
    .await;
    assert_eq!(c.waiters(&key).await, WAITERS_PER_KEY_MAX as u32);
    let over = c.session("over").await;
    is_invalid(
        "a waiter past WAITERS_PER_KEY_MAX",
        c.store
            .acquire_request(&over, 1, &key, LOCK_TTL_LONG, WAIT_LONG)
            .await,
    );
    // A zero wait does not queue, so it is answered, not refused.
    assert_eq!(
        c.acquire(&over, 2, &key, Duration::ZERO).await,
        Acquired::NotGranted
    );
    assert_eq!(c.waiters(&key).await, WAITERS_PER_KEY_MAX as u32);
    let closed = fan_out(sessions.len(), |n| {
        let (store, s) = (c.store.clone(), sessions[n].clone());
        async move { store.close_session(&s).await }
    })
    .await;
    assert!(closed.iter().all(|r| *r == Ok(0)), "waiters hold nothing");
    assert_eq!(c.store.close_session(&over).await, Ok(0));
    assert_eq!(c.waiters(&key).await, 0, "closed sessions leave the queue");
    assert_eq!(c.store.close_session(&holder).await, Ok(1));
}

async fn locks_per_session_are_bounded<S: RequestStore + Clone + 'static>(c: &RCtx<S>) {
    let (s, _) = c
        .store
        .open_session_with_ttl("greedy", BOUND_TTL)
        .await
        .expect("open");
    let granted = fan_out(LOCKS_PER_SESSION_MAX, |n| {
        let (store, s, key) = (c.store.clone(), s.clone(), c.key("locks-bound", n));
        async move {
            store
                .acquire_request(&s, 1 + n as u64, &key, BOUND_TTL, Duration::ZERO)
                .await
        }
    })
    .await;
    for (n, g) in granted.iter().enumerate() {
        assert!(matches!(g, Ok(Acquired::Granted(_))), "grant {n}: {g:?}");
    }
    let over = c.key("locks-bound", LOCKS_PER_SESSION_MAX);
    is_invalid(
        "a grant past LOCKS_PER_SESSION_MAX",
        c.store
            .acquire_request(&s, 5000, &over, LOCK_TTL_LONG, Duration::ZERO)
            .await,
    );
    assert_eq!(
        c.store.read(&over).await,
        Ok(None),
        "the refused acquire changed nothing"
    );
    assert_eq!(c.store.close_session(&s).await, Ok(LOCKS_PER_SESSION_MAX));
}

async fn a_lost_notification_channel_loses_no_hand_off<S: RequestStore + Clone + 'static>(
    c: &RCtx<S>,
    break_notifications: Cut,
) {
    let key = c.key("lost-channel", 0);
    let (holder, h, waiter, wait) =
        holder_and_waiter(c, &key, LOCK_TTL_LONG, SESSION_TTL_LONG).await;
    // The channel is down when the hand-off commits, so its notification is lost; the waiter
    // must learn of the grant anyway (re-read on reconnect), well before its wait would end.
    break_notifications().await;
    assert_eq!(
        c.store
            .release_request(&holder, 2, &key, h.fencing_token)
            .await,
        Ok(true)
    );
    handed_to(
        c,
        "a hand-off while the channel was down",
        &key,
        &waiter,
        wait,
        h.fencing_token,
    )
    .await;
    c.store.close_session(&holder).await.expect("close");
    assert_eq!(c.store.close_session(&waiter).await, Ok(1));
}
