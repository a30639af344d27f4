//! The stateless backend against the in-memory store, under paused tokio time: waits, the
//! deadline's cancel, cancel-on-drop, the stop signal, batch heartbeats, validation and admin.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lock_api::LockError;
use tokio::sync::watch;

use super::memory::{MemoryStore, RequestState};
use super::{KEEP_ALIVE_CONCURRENCY_MAX, StatelessBackend};
use crate::backend::{Backend, Role};
use crate::clock::ManualClock;

const TTL_MS: u64 = 5_000;

struct Fixture {
    backend: StatelessBackend<MemoryStore>,
    stop: watch::Sender<bool>,
}

impl Fixture {
    fn store(&self) -> &MemoryStore {
        self.backend.store()
    }
}

fn fixture() -> Fixture {
    let (stop, stop_rx) = watch::channel(false);
    let backend = StatelessBackend::new(
        MemoryStore::default(),
        7,
        "127.0.0.1:7107".into(),
        Arc::new(ManualClock::new(1_000)),
        stop_rx,
    );
    Fixture { backend, stop }
}

async fn session(f: &Fixture, owner: &str) -> String {
    f.backend.open_session(None, owner, TTL_MS).await.unwrap().0
}

/// Lets spawned tasks run until they block.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_are_granted_in_queue_order_with_the_owner_of_their_session() {
    let f = fixture();
    let (a, b, c) = (
        session(&f, "alice").await,
        session(&f, "bob").await,
        session(&f, "carol").await,
    );
    let held = f
        .backend
        .try_acquire(None, &a, 1, "k", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    let wait = |s: String, id| {
        let backend = f.backend.clone();
        tokio::spawn(async move { backend.acquire(None, &s, id, "k", TTL_MS, 60_000).await })
    };
    let first = wait(b.clone(), 1);
    settle().await;
    let second = wait(c.clone(), 1);
    settle().await;
    let state = f.backend.inspect("k", true).await.unwrap().unwrap();
    assert_eq!(state.session_id, a, "inspect names the holder's session");
    assert_eq!(state.owner_id, "alice");
    assert_eq!(state.waiter_count, 2);

    assert!(
        f.backend
            .release(None, &a, 2, "k", held.token)
            .await
            .unwrap()
    );
    let got = first.await.unwrap().unwrap().expect("first waiter granted");
    assert_eq!(got.session_id, b);
    assert_eq!(got.owner_id, "bob", "the owner comes from the session");
    assert!(got.token > held.token);
    assert!(!second.is_finished(), "the second waiter still waits");
    assert_eq!(
        f.backend
            .inspect("k", false)
            .await
            .unwrap()
            .unwrap()
            .waiter_count,
        1
    );
    assert!(
        f.backend
            .release(None, &b, 2, "k", got.token)
            .await
            .unwrap()
    );
    let got = second
        .await
        .unwrap()
        .unwrap()
        .expect("second waiter granted");
    assert_eq!(got.session_id, c);
}

#[tokio::test(start_paused = true)]
async fn at_the_deadline_the_request_is_withdrawn_and_the_answer_is_none() {
    let f = fixture();
    let (a, b) = (session(&f, "a").await, session(&f, "b").await);
    f.backend
        .try_acquire(None, &a, 1, "k", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    let started = tokio::time::Instant::now();
    let got = f
        .backend
        .acquire(None, &b, 9, "k", TTL_MS, 250)
        .await
        .unwrap();
    assert_eq!(got, None);
    assert_eq!(started.elapsed(), Duration::from_millis(250));
    assert_eq!(f.store().queued("k"), 0, "the wait was withdrawn");
    assert_eq!(
        *f.store().cancels.lock().unwrap(),
        vec![(b.clone(), 9, false)],
        "a deadline's cancel keeps a raced grant"
    );
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_raced_the_deadline_is_the_callers() {
    let f = fixture();
    let (a, b) = (session(&f, "a").await, session(&f, "b").await);
    f.backend
        .try_acquire(None, &a, 1, "k", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    *f.store().grant_before_cancel.lock().unwrap() = true;
    let got = f
        .backend
        .acquire(None, &b, 9, "k", TTL_MS, 250)
        .await
        .unwrap()
        .expect("the raced grant is answered");
    assert_eq!(got.session_id, b);
    assert_eq!(f.store().holder_token("k"), Some(got.token), "and kept");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_caller_withdraws_the_request_and_releases_a_raced_grant() {
    let f = fixture();
    let (a, b) = (session(&f, "a").await, session(&f, "b").await);
    let held = f
        .backend
        .try_acquire(None, &a, 1, "k", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    let backend = f.backend.clone();
    let b2 = b.clone();
    let call =
        tokio::spawn(async move { backend.acquire(None, &b2, 5, "k", TTL_MS, 60_000).await });
    settle().await;
    assert_eq!(f.store().queued("k"), 1);
    call.abort();
    settle().await;
    assert_eq!(
        *f.store().cancels.lock().unwrap(),
        vec![(b.clone(), 5, true)]
    );
    assert_eq!(f.store().queued("k"), 0);
    assert_eq!(f.store().request(&b, 5), Some(RequestState::NotGranted));

    // Again, with the hand-off landing just before the cancel: the grant is released.
    let backend = f.backend.clone();
    let b2 = b.clone();
    let call =
        tokio::spawn(async move { backend.acquire(None, &b2, 6, "k", TTL_MS, 60_000).await });
    settle().await;
    *f.store().grant_before_cancel.lock().unwrap() = true;
    call.abort();
    settle().await;
    assert_eq!(
        f.store().cancels.lock().unwrap().last(),
        Some(&(b.clone(), 6, true))
    );
    assert_eq!(
        f.store().holder_token("k"),
        None,
        "the raced grant was released"
    );
    assert_ne!(f.store().holder_token("k"), Some(held.token));
}

#[tokio::test(start_paused = true)]
async fn an_answered_acquire_cancels_nothing() {
    let f = fixture();
    let a = session(&f, "a").await;
    let got = f
        .backend
        .acquire(None, &a, 1, "k", TTL_MS, 1_000)
        .await
        .unwrap();
    assert!(got.is_some());
    settle().await;
    assert!(f.store().cancels.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_stop_signal_ends_a_wait_and_leaves_the_request_for_a_retry() {
    let f = fixture();
    let (a, b) = (session(&f, "a").await, session(&f, "b").await);
    f.backend
        .try_acquire(None, &a, 1, "k", TTL_MS)
        .await
        .unwrap()
        .unwrap();
    let backend = f.backend.clone();
    let b2 = b.clone();
    let call =
        tokio::spawn(async move { backend.acquire(None, &b2, 3, "k", TTL_MS, 60_000).await });
    settle().await;
    f.stop.send(true).unwrap();
    let err = call.await.unwrap().unwrap_err();
    assert!(matches!(err, LockError::Contention { .. }), "{err:?}");
    settle().await;
    assert!(f.store().cancels.lock().unwrap().is_empty());
    assert_eq!(f.store().request(&b, 3), Some(RequestState::Waiting));
}

#[tokio::test(start_paused = true)]
async fn heartbeats_answer_the_ttl_the_store_keeps() {
    let f = fixture();
    let (id, ttl_ms) = f.backend.open_session(None, "o", 1_500).await.unwrap();
    assert_eq!(ttl_ms, 2_000, "the store rounds up to whole seconds");
    assert_eq!(f.backend.keep_alive(None, &id).await.unwrap(), Some(2_000));
    assert_eq!(f.backend.close_session(None, &id).await.unwrap(), 0);
    assert_eq!(f.backend.keep_alive(None, &id).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_batch_answers_each_session_in_order_with_bounded_concurrency() {
    let f = fixture();
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(session(&f, &format!("o{i}")).await);
    }
    ids.push("gone".into());
    ids.push(String::new());
    *f.store().keep_alive_delay.lock().unwrap() = Duration::from_millis(10);
    let answers = f.backend.keep_alive_batch(None, &ids).await.unwrap();
    assert_eq!(answers.len(), 42);
    assert!(answers[..40].iter().all(|a| matches!(a, Ok(Some(5_000)))));
    assert!(matches!(answers[40], Ok(None)));
    assert!(matches!(
        answers[41],
        Err(LockError::InvalidArgument { .. })
    ));
    let most = f.store().in_flight_max.load(Ordering::SeqCst);
    assert_eq!(most, KEEP_ALIVE_CONCURRENCY_MAX, "concurrent, and bounded");
}

#[tokio::test(start_paused = true)]
async fn bad_arguments_are_refused_before_the_store_is_asked() {
    let f = fixture();
    let calls = || f.store().calls.load(Ordering::SeqCst);
    // As on the Raft backend: max_wait first, then session, key, ttl.
    let err = f
        .backend
        .acquire(None, "", 1, "", 0, u64::MAX)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_wait"), "{err}");
    let err = f.backend.acquire(None, "", 1, "", 0, 10).await.unwrap_err();
    assert!(err.to_string().contains("session"), "{err}");
    let err = f
        .backend
        .try_acquire(None, "s", 1, "", 0)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("key"), "{err}");
    let err = f
        .backend
        .renew(None, "s", 1, "k", 0, TTL_MS)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("token"), "{err}");
    let err = f.backend.open_session(None, "o", 1).await.unwrap_err();
    assert!(err.to_string().contains("ttl"), "{err}");
    assert_eq!(calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_stateless_node_leads_alone_and_has_no_membership() {
    let f = fixture();
    let s = f.backend.status();
    assert_eq!(s.role, Role::Leader);
    assert_eq!(s.leader_id, Some(7));
    assert_eq!(s.leader_addr, "127.0.0.1:7107");
    assert_eq!(s.members.len(), 1);
    assert!(s.initialized);
    let err = f.backend.init(Default::default()).await.unwrap_err();
    assert!(err.to_string().contains("memory backend"), "{err}");
    assert!(matches!(err, LockError::InvalidArgument { .. }));
    assert!(
        f.backend
            .change_membership([1].into(), false)
            .await
            .is_err()
    );
    assert!(*f.backend.serving().borrow());
}

#[tokio::test(start_paused = true)]
async fn the_reaper_runs_every_interval_until_stop() {
    let f = fixture();
    let reaper = tokio::spawn(f.backend.clone().run_reaper());
    let interval = lock_api::RequestStore::reap_interval(f.store());
    tokio::time::sleep(interval * 3 + Duration::from_millis(1)).await;
    let reaps = f.store().calls.load(Ordering::SeqCst);
    assert!((3..=4).contains(&reaps), "{reaps}");
    f.stop.send(true).unwrap();
    reaper.await.unwrap();
}

/// A session belongs to the principal that opened it (docs/SECURITY.md §3): every call of
/// another principal presenting it, or a grant of it, is refused and changes nothing.
#[tokio::test(start_paused = true)]
async fn another_principal_is_refused_a_session_and_its_grant() {
    let f = fixture();
    let alice = Some("alice");
    let bob = Some("bob");
    let (a, _) = f
        .backend
        .open_session(alice, "worker", TTL_MS)
        .await
        .unwrap();
    let (b, _) = f.backend.open_session(bob, "worker", TTL_MS).await.unwrap();
    let held = f
        .backend
        .try_acquire(alice, &a, 1, "k", TTL_MS)
        .await
        .unwrap()
        .expect("granted");
    let denied = |result: Result<(), LockError>, what: &str| match result {
        Err(LockError::PermissionDenied {
            principal,
            required_role,
        }) => {
            assert_eq!(principal, "bob", "{what}");
            assert_eq!(required_role, lock_api::SESSION_OWNER_ROLE, "{what}");
        }
        other => panic!("{what}: {other:?}"),
    };
    let backend = &f.backend;
    denied(backend.keep_alive(bob, &a).await.map(drop), "keep_alive");
    denied(backend.locks_of(bob, &a).await.map(drop), "locks_of");
    denied(
        backend.try_acquire(bob, &a, 2, "x", TTL_MS).await.map(drop),
        "try_acquire",
    );
    denied(
        backend
            .acquire(bob, &a, 3, "x", TTL_MS, 1_000)
            .await
            .map(drop),
        "acquire",
    );
    denied(
        backend.cancel_acquire(bob, &a, 1, "k").await.map(drop),
        "cancel",
    );
    denied(
        backend
            .renew(bob, &a, 4, "k", held.token, TTL_MS)
            .await
            .map(drop),
        "renew",
    );
    denied(
        backend.release(bob, &a, 5, "k", held.token).await.map(drop),
        "release",
    );
    // Bob's own session does not carry alice's grant either.
    denied(
        backend.release(bob, &b, 1, "k", held.token).await.map(drop),
        "release via own",
    );
    denied(
        backend
            .renew(bob, &b, 2, "k", held.token, TTL_MS)
            .await
            .map(drop),
        "renew via own",
    );
    denied(backend.close_session(bob, &a).await.map(drop), "close");
    let answers = backend
        .keep_alive_batch(bob, &[a.clone(), b.clone()])
        .await
        .unwrap();
    denied(answers[0].clone().map(drop), "batch entry");
    assert!(
        matches!(answers[1], Ok(Some(_))),
        "bob's own entry: {:?}",
        answers[1]
    );

    let state = backend
        .inspect("k", true)
        .await
        .unwrap()
        .expect("still held");
    assert_eq!(
        (state.session_id.as_str(), state.token),
        (a.as_str(), held.token)
    );
    assert_eq!(backend.locks_of(alice, &a).await.unwrap().len(), 1);
    assert!(
        backend
            .renew(alice, &a, 6, "k", held.token, TTL_MS)
            .await
            .unwrap()
            .is_some()
    );
    // With no caller (an --insecure node) nobody is refused.
    assert_eq!(backend.keep_alive(None, &a).await.unwrap(), Some(TTL_MS));
    assert!(
        backend
            .release(alice, &a, 7, "k", held.token)
            .await
            .unwrap()
    );
}
