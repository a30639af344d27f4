//! The session's promises about time, under Tokio's paused clock: deadlines, renewals, death
//! by silent heartbeats and the lost-lock listeners, with a client whose only endpoint
//! refuses connections (every call fails transiently, as in a partition). Paused time makes
//! the deadlines exact and the tests take no real time; the fake-server tests in
//! `client/tests/fake_cluster.rs` cover the answers of a server.

use std::time::{Duration, Instant};

use lock_api::{LockError, LockHandle};
use tokio::sync::mpsc;

use super::LockClientSession;
use super::state::test_handle;
use crate::client::LockClient;
use crate::clock;
use crate::config::ClientConfig;

/// A local port nothing listens on: every call to it fails with a transient error.
const REFUSING_ENDPOINT: &str = "127.0.0.1:1";

/// How long a test waits (in paused, auto-advancing time) for listener calls that must come.
const LISTENER_WAIT: Duration = Duration::from_secs(60);

/// A session `s1` of `ttl` opened at `t0` on a client that reaches no server, and a channel
/// that receives the fencing token of every lost-lock listener call.
fn open(ttl: Duration, t0: Instant) -> (LockClientSession, mpsc::UnboundedReceiver<u64>) {
    let client = LockClient::unconnected(&[REFUSING_ENDPOINT], ClientConfig::default());
    let session = LockClientSession::start(client, "s1".into(), "owner".into(), ttl, t0);
    let (tx, rx) = mpsc::unbounded_channel();
    session.on_lock_lost(move |handle: &LockHandle| {
        let _ = tx.send(handle.fencing_token);
    });
    (session, rx)
}

/// A grant of the session, as an acquire sent at `sent_at` would have tracked it.
fn grant(session: &LockClientSession, token: u64, ttl: Duration, sent_at: Instant) -> LockHandle {
    let margin = session.inner.margin_for(ttl);
    let handle = test_handle("k", token, ttl, sent_at + ttl - margin);
    session.inner.track(&handle, sent_at);
    handle
}

/// The next `n` listener calls, sorted; panics if they do not all come.
async fn next_lost(rx: &mut mpsc::UnboundedReceiver<u64>, n: usize) -> Vec<u64> {
    let mut tokens = Vec::new();
    while tokens.len() < n {
        let token = tokio::time::timeout(LISTENER_WAIT, rx.recv())
            .await
            .expect("a lost-lock listener call came")
            .expect("the listener lives");
        tokens.push(token);
    }
    tokens.sort_unstable();
    tokens
}

/// No further listener call arrives within one more `LISTENER_WAIT`.
async fn no_more_lost(rx: &mut mpsc::UnboundedReceiver<u64>) {
    tokio::time::sleep(LISTENER_WAIT).await;
    assert!(rx.try_recv().is_err(), "a grant was reported lost twice");
}

async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

fn is_lost(result: Result<(), LockError>) -> bool {
    matches!(result, Err(LockError::LockLost { .. }))
}

#[tokio::test(start_paused = true)]
async fn a_renewal_extends_check_still_held_until_the_new_deadline() {
    let t0 = clock::now();
    let (session, mut rx) = open(Duration::from_secs(120), t0);
    let ttl = Duration::from_secs(10);
    // The default margin of a 10 s lease is 1 s: held until t0 + 9 s.
    let first = grant(&session, 7, ttl, t0);
    sleep_until(t0 + Duration::from_millis(8_900)).await;
    session
        .check_still_held(&first)
        .expect("held before its deadline");

    // A renewal sent at t0 + 8 s moves the deadline to t0 + 17 s; the old handle counts it.
    let renewed = test_handle("k", 7, ttl, t0 + Duration::from_secs(17));
    session.inner.track(&renewed, t0 + Duration::from_secs(8));
    sleep_until(t0 + Duration::from_secs(16)).await;
    session
        .check_still_held(&first)
        .expect("held after the first deadline, renewed");
    assert_eq!(
        session.latest(&first).expect("still held").client_deadline,
        renewed.client_deadline
    );

    sleep_until(t0 + Duration::from_millis(17_001)).await;
    assert!(is_lost(session.check_still_held(&first)));
    assert!(is_lost(session.check_still_held(&renewed)));
    assert!(session.latest(&first).is_err());
    assert_eq!(next_lost(&mut rx, 1).await, vec![7]);
    no_more_lost(&mut rx).await;
    assert!(
        session.is_alive(),
        "losing a grant does not end the session"
    );
}

#[tokio::test(start_paused = true)]
async fn check_still_held_fails_at_the_deadline_minus_the_margin_not_at_the_ttl() {
    let t0 = clock::now();
    let (session, mut rx) = open(Duration::from_secs(120), t0);
    let handle = grant(&session, 3, Duration::from_secs(10), t0);
    sleep_until(t0 + Duration::from_millis(8_999)).await;
    session
        .check_still_held(&handle)
        .expect("held before ttl - margin");
    // Past `ttl - margin`, although the 10 s lease itself has not run out on the server.
    sleep_until(t0 + Duration::from_secs(9)).await;
    assert!(is_lost(session.check_still_held(&handle)));
    assert_eq!(next_lost(&mut rx, 1).await, vec![3]);
    // Asking again answers the same, and reports nothing new.
    assert!(is_lost(session.check_still_held(&handle)));
    no_more_lost(&mut rx).await;
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_heartbeats_fail_dies_at_its_deadline_and_reports_each_grant_once() {
    let t0 = clock::now();
    let ttl = Duration::from_secs(3);
    let (session, mut rx) = open(ttl, t0);
    // Grants whose own deadlines are far ahead: only the session's death can end them.
    let grants: Vec<LockHandle> = (1..=3)
        .map(|token| grant(&session, token, Duration::from_secs(60), t0))
        .collect();
    // The session's local deadline: 3 s - 300 ms margin. Heartbeats have been failing since
    // t0 + 1 s, but a transient failure kills nothing before the deadline.
    sleep_until(t0 + Duration::from_millis(2_650)).await;
    assert!(session.is_alive());
    for handle in &grants {
        session
            .check_still_held(handle)
            .expect("held while the session is");
    }

    sleep_until(t0 + Duration::from_millis(2_750)).await;
    assert!(!session.is_alive(), "dead once its local deadline passed");
    assert_eq!(next_lost(&mut rx, 3).await, vec![1, 2, 3]);
    for handle in &grants {
        assert!(is_lost(session.check_still_held(handle)));
    }
    assert!(matches!(
        session.try_acquire("other", Duration::from_secs(5)).await,
        Err(LockError::InvalidArgument { .. })
    ));
    assert!(session.keep_alive(&grants[0]).is_err());
    no_more_lost(&mut rx).await;
}

#[tokio::test(start_paused = true)]
async fn an_answered_heartbeat_moves_the_session_deadline_and_a_late_one_revives_nothing() {
    let t0 = clock::now();
    let ttl = Duration::from_secs(3);
    let (session, mut rx) = open(ttl, t0);
    let handle = grant(&session, 5, Duration::from_secs(60), t0);
    let sent = t0 + Duration::from_secs(2);
    sleep_until(sent).await;
    let next = session.inner.on_heartbeat(sent, Ok(Some(ttl)));
    assert_eq!(
        next,
        Some(sent + ttl / 3),
        "the next heartbeat is a third of the TTL on"
    );
    // Alive past the open's deadline (t0 + 2.7 s), until sent + 2.7 s.
    sleep_until(sent + Duration::from_millis(2_650)).await;
    assert!(session.is_alive());
    session
        .check_still_held(&handle)
        .expect("held with its session");

    sleep_until(sent + Duration::from_millis(2_750)).await;
    assert!(!session.is_alive());
    assert_eq!(next_lost(&mut rx, 1).await, vec![5]);
    let late = session.inner.on_heartbeat(sent, Ok(Some(ttl)));
    assert_eq!(late, None, "a late answer schedules nothing");
    assert!(!session.is_alive());
    no_more_lost(&mut rx).await;
}

#[tokio::test(start_paused = true)]
async fn the_server_declaring_the_session_dead_loses_every_grant_at_once() {
    let t0 = clock::now();
    let (session, mut rx) = open(Duration::from_secs(30), t0);
    let grants: Vec<LockHandle> = (1..=2)
        .map(|token| grant(&session, token, Duration::from_secs(30), t0))
        .collect();
    assert_eq!(session.inner.on_heartbeat(t0, Ok(None)), None);
    assert!(!session.is_alive());
    assert_eq!(next_lost(&mut rx, 2).await, vec![1, 2]);
    assert!(is_lost(session.check_still_held(&grants[1])));
    // The server said so: closing asks it nothing more.
    assert_eq!(session.close().await.expect("closes locally"), 0);
    no_more_lost(&mut rx).await;
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_whose_renewals_fail_reports_the_grant_lost_at_its_deadline() {
    let t0 = clock::now();
    let (session, mut rx) = open(Duration::from_secs(120), t0);
    let handle = grant(&session, 9, Duration::from_secs(3), t0);
    session.keep_alive(&handle).expect("keep-alive starts");
    session
        .keep_alive(&handle)
        .expect("a second call does nothing");
    // Renewals fail from t0 + 1 s on; the grant is held until its deadline, 3 s - 300 ms.
    sleep_until(t0 + Duration::from_millis(2_650)).await;
    session
        .check_still_held(&handle)
        .expect("held until the deadline");
    sleep_until(t0 + Duration::from_millis(2_750)).await;
    assert!(is_lost(session.check_still_held(&handle)));
    assert_eq!(next_lost(&mut rx, 1).await, vec![9]);
    assert!(matches!(
        session.keep_alive(&handle),
        Err(LockError::LockLost { .. })
    ));
    assert!(session.is_alive());
    no_more_lost(&mut rx).await;
}

#[tokio::test(start_paused = true)]
async fn detaching_fires_no_listener() {
    let t0 = clock::now();
    let (session, mut rx) = open(Duration::from_secs(3), t0);
    grant(&session, 4, Duration::from_secs(3), t0);
    assert_eq!(session.detach(), "s1");
    // Past every deadline: a detached session reports nothing.
    // Paused time: this advances the virtual clock at once, it does not wait.
    sleep_until(t0 + Duration::from_secs(10)).await;
    no_more_lost(&mut rx).await;
}
