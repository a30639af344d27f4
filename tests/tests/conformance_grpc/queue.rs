//! Cases on waiting acquires: a released key goes to the waiters in arrival order, each
//! hand-off inside the waiter's one `Acquire` call (docs/DESIGN.md D-wait); `Inspect` counts
//! the queued acquires; and an acquire whose caller gave up — the SDK future dropped, or the
//! raw RPC cancelled — leaves neither a waiter nor a grant behind (C2 §2.8 cancellation).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_client::ClientConfig;
use lock_tests::{Grant, LockError, NodeClient, next_request_id, poll_until};
use tokio::task::JoinSet;

use super::{ANSWER_WAIT, Findings, LONG_TTL, QUEUE_WAIT, Target, WAITER_MAX_WAIT, expect_waiters};

/// How many sessions queue on one key in the FIFO case.
const FIFO_WAITERS: usize = 5;

/// How many acquires queue in the waiter-count case.
const COUNTED_WAITERS: u32 = 3;

/// `max_wait` of the queued acquires of the FIFO and waiter-count cases: a waiter must still
/// wait when its turn comes even if every queue check before it ran to its [`QUEUE_WAIT`]
/// bound (a backend whose `waiter_count` is wrong), so that the case goes on to show the order.
const QUEUED_MAX_WAIT: Duration =
    Duration::from_secs(FIFO_WAITERS as u64 * QUEUE_WAIT.as_secs() + WAITER_MAX_WAIT.as_secs());

/// `max_wait` of the acquire a cancellation case drops: longer than the [`QUEUE_WAIT`] the
/// case may spend before the drop, so the acquire is still waiting when it is dropped, and no
/// longer, because after the drop the case watches the key until it has passed (plus
/// [`CANCEL_WATCH_SLACK`]): a server that kept the dropped wait alive could grant it till then.
const CANCELLED_MAX_WAIT: Duration = Duration::from_secs(QUEUE_WAIT.as_secs() + 5);

/// How long past the dropped acquire's `max_wait` the case keeps watching: a server's timer
/// and a commit on two loaded cores.
const CANCEL_WATCH_SLACK: Duration = Duration::from_secs(2);

/// Pause between two looks at the key while watching it.
const WATCH_INTERVAL: Duration = Duration::from_millis(50);

/// One raw `Acquire` RPC of `key` by `session_id` at `node`: no client retry, so a grant in its
/// answer was handed over by the server inside this one call.
async fn one_acquire_rpc(
    node: NodeClient,
    session_id: String,
    key: String,
    max_wait: Duration,
) -> Result<Option<Grant>, LockError> {
    node.acquire_with_request_id(&session_id, next_request_id(), &key, LONG_TTL, max_wait)
        .await
}

/// Five sessions queue on a held key one after another (each is seen in `waiter_count` before
/// the next starts, so the arrival order is known), on alternating nodes where there are
/// several; the holder releases, and each release hands the key to the next waiter in arrival
/// order, answered inside that waiter's single `Acquire` RPC, with strictly increasing tokens.
pub async fn fifo(t: &mut Target) {
    let mut f = Findings::new(t, "fifo");
    let any = t.any();
    let key = t.key("fifo", 0);
    let holder = any
        .open_session(&t.owner("fifo-holder"), LONG_TTL)
        .await
        .expect("open the holder's session");
    let first = t
        .node(0)
        .await
        .try_acquire(&holder.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");

    let mut sessions = Vec::new();
    let mut waiting = JoinSet::new();
    for i in 0..FIFO_WAITERS {
        let session = any
            .open_session(&t.owner(&format!("fifo-waiter-{i}")), LONG_TTL)
            .await
            .expect("open a waiter's session");
        let node = t.node(i).await;
        let rpc = one_acquire_rpc(node, session.id.clone(), key.clone(), QUEUED_MAX_WAIT);
        waiting.spawn(async move { (i, rpc.await) });
        // Known arrival order: the next waiter starts only once this one is queued (or, on a
        // backend whose waiter_count never shows it, a whole QUEUE_WAIT later).
        let queued = u32::try_from(i + 1).expect("a handful of waiters");
        expect_waiters(t, &mut f, &key, queued, &format!("waiter {i} queued")).await;
        sessions.push(session);
    }

    let mut order = Vec::new();
    let mut current = (holder.id.clone(), first.clone());
    for hand_off in 0..FIFO_WAITERS {
        let (session_id, grant) = &current;
        let released = any
            .release(session_id, &key, grant.fencing_token)
            .await
            .expect("release by the holder");
        f.check(released, || {
            format!("hand-off {hand_off}: the holder's release answered false")
        });
        let answer = tokio::time::timeout(ANSWER_WAIT, waiting.join_next()).await;
        let (i, granted) = match answer {
            Ok(Some(Ok(done))) => done,
            Ok(Some(Err(e))) => panic!("a waiter task failed: {e}"),
            Ok(None) => unreachable!("one waiter task per hand-off"),
            Err(_) => {
                f.fail(format!(
                    "hand-off {hand_off}: no waiter answered within {ANSWER_WAIT:?} of the release"
                ));
                break;
            }
        };
        order.push(i);
        match granted {
            Ok(Some(next)) => {
                f.check(next.session_id == sessions[i].id, || {
                    format!("waiter {i}'s grant names session {:?}", next.session_id)
                });
                f.check(next.fencing_token > grant.fencing_token, || {
                    format!(
                        "hand-off {hand_off}: token {} after {}: tokens must strictly increase",
                        next.fencing_token, grant.fencing_token
                    )
                });
                current = (sessions[i].id.clone(), next);
            }
            other => {
                f.fail(format!(
                    "hand-off {hand_off}: waiter {i}'s one Acquire RPC answered {other:?}, not a grant"
                ));
                break;
            }
        }
    }
    let arrival: Vec<usize> = (0..FIFO_WAITERS).collect();
    f.check(order == arrival, || {
        format!("the waiters were granted in the order {order:?}; they arrived in {arrival:?}")
    });
    f.finish();
}

/// Three acquires queue on a held key: `Inspect` counts each as it arrives, and one fewer once
/// the release handed the key to the first.
pub async fn waiter_count(t: &mut Target) {
    let mut f = Findings::new(t, "waiter_count");
    let any = t.any();
    let key = t.key("waiter-count", 0);
    let holder = any
        .open_session(&t.owner("count-holder"), LONG_TTL)
        .await
        .expect("open");
    let held = t
        .node(0)
        .await
        .try_acquire(&holder.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    f.check(
        t.inspect_at(0, &key).await.map(|i| i.waiter_count) == Some(0),
        || "a held key without waiters must report waiter_count 0".to_owned(),
    );
    let mut waiting = JoinSet::new();
    for i in 0..COUNTED_WAITERS {
        let session = any
            .open_session(&t.owner(&format!("count-waiter-{i}")), LONG_TTL)
            .await
            .expect("open");
        let node = t.node(i as usize).await;
        waiting.spawn(one_acquire_rpc(
            node,
            session.id,
            key.clone(),
            QUEUED_MAX_WAIT,
        ));
        expect_waiters(t, &mut f, &key, i + 1, &format!("{} queued", i + 1)).await;
    }
    assert!(
        any.release(&holder.id, &key, held.fencing_token)
            .await
            .expect("release"),
        "the holder's release"
    );
    // The first waiter is granted, so one fewer is queued.
    match tokio::time::timeout(ANSWER_WAIT, waiting.join_next()).await {
        Ok(Some(Ok(Ok(Some(_))))) => {}
        other => f.fail(format!(
            "after the release no waiter was granted: {other:?}"
        )),
    }
    expect_waiters(t, &mut f, &key, COUNTED_WAITERS - 1, "one waiter granted").await;
    f.finish();
}

/// An SDK acquire waiting on a held key is dropped (its future goes away, as when a caller's
/// `select!` or timeout abandons it): the wait is withdrawn, and once the holder releases, the
/// key stays free — the dropped acquire is never granted behind its caller's back.
pub async fn cancel_sdk_drop(t: &mut Target) {
    let mut f = Findings::new(t, "cancel on SDK drop");
    let any = t.any();
    let key = t.key("cancel-sdk", 0);
    let holder = any
        .open_session(&t.owner("cancel-holder"), LONG_TTL)
        .await
        .expect("open");
    let held = any
        .try_acquire(&holder.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let client = t.sdk(ClientConfig::default()).await;
    let waiter = Arc::new(
        client
            .open_session(&t.owner("cancel-sdk-waiter"))
            .await
            .expect("SDK open_session"),
    );
    let sent = Instant::now();
    let pending = {
        let waiter = Arc::clone(&waiter);
        let key = key.clone();
        tokio::spawn(async move { waiter.acquire(&key, LONG_TTL, CANCELLED_MAX_WAIT).await })
    };
    let queued = expect_waiters(t, &mut f, &key, 1, "the SDK acquire queued").await;
    pending.abort();
    let dropped = pending.await;
    f.check(dropped.as_ref().is_err_and(|e| e.is_cancelled()), || {
        format!("the SDK acquire finished before it could be dropped: {dropped:?}")
    });
    let session_id = waiter.session_id().to_owned();
    leaves_nothing(t, &mut f, &key, &holder.id, held, &session_id, sent, queued).await;
    drop(waiter);
    f.finish();
}

/// As [`cancel_sdk_drop`], for a raw `Acquire` RPC whose caller cancels it (the tonic future
/// dropped, which resets the HTTP/2 stream).
pub async fn cancel_rpc_drop(t: &mut Target) {
    let mut f = Findings::new(t, "cancel on RPC drop");
    let any = t.any();
    let key = t.key("cancel-rpc", 0);
    let holder = any
        .open_session(&t.owner("cancel-holder"), LONG_TTL)
        .await
        .expect("open");
    let waiter = any
        .open_session(&t.owner("cancel-rpc-waiter"), LONG_TTL)
        .await
        .expect("open");
    let held = any
        .try_acquire(&holder.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let node = t.node(1).await;
    let sent = Instant::now();
    let pending = tokio::spawn(one_acquire_rpc(
        node,
        waiter.id.clone(),
        key.clone(),
        CANCELLED_MAX_WAIT,
    ));
    let queued = expect_waiters(t, &mut f, &key, 1, "the Acquire RPC queued").await;
    pending.abort();
    let dropped = pending.await;
    f.check(dropped.as_ref().is_err_and(|e| e.is_cancelled()), || {
        format!("the Acquire RPC finished before it could be cancelled: {dropped:?}")
    });
    leaves_nothing(t, &mut f, &key, &holder.id, held, &waiter.id, sent, queued).await;
    f.finish();
}

/// After a waiting acquire of `key` by `waiter_session` (sent at `sent`) was dropped: the
/// queue empties, the holder releases, and until the dropped acquire's `max_wait` has surely
/// run out the key is never granted again — at the end it is free and the waiter's session
/// holds nothing.
#[allow(clippy::too_many_arguments)]
async fn leaves_nothing(
    t: &mut Target,
    f: &mut Findings,
    key: &str,
    holder_session: &str,
    held: Grant,
    waiter_session: &str,
    sent: Instant,
    was_queued: bool,
) {
    if was_queued {
        expect_waiters(t, f, key, 0, "the dropped acquire withdrawn").await;
    }
    let any = t.any();
    assert!(
        any.release(holder_session, key, held.fencing_token)
            .await
            .expect("release"),
        "the holder's release"
    );
    // A server that kept the dropped wait could still grant it until its max_wait ends; watch
    // the key until then, failing at the first grant seen.
    let watch_until = sent + CANCELLED_MAX_WAIT + CANCEL_WATCH_SLACK;
    let node = t.node(0).await;
    loop {
        match node.inspect(key, true).await {
            Ok(None) => {}
            Ok(Some(info)) => {
                f.fail(format!(
                    "the key was granted after the holder released, though its only waiter had \
                     been dropped: {info:?} (waiter session {waiter_session:?})"
                ));
                break;
            }
            // A busy node; the next look decides.
            Err(e) if e.is_retry_safe() => {}
            Err(e) => panic!("{}: Inspect({key:?}): {e}", t.name),
        }
        if Instant::now() >= watch_until {
            break;
        }
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
    let locks = poll_until("LocksOf of the dropped waiter", QUEUE_WAIT, || {
        let any = any.clone();
        let session = waiter_session.to_owned();
        async move { any.locks_of(&session).await.map_err(|e| e.to_string()) }
    })
    .await
    .expect("LocksOf answers");
    f.check(locks.is_empty(), || {
        format!("the dropped waiter's session holds {locks:?}")
    });
    match t.inspect_at(1, key).await {
        None => {}
        Some(info) => f.fail(format!(
            "the key ended held ({info:?}); it must end free with waiter_count 0"
        )),
    }
}

const _: () = assert!(QUEUED_MAX_WAIT.as_secs() <= lock_api::limits::MAX_WAIT_MAX.as_secs());
const _: () = assert!(CANCELLED_MAX_WAIT.as_secs() > QUEUE_WAIT.as_secs());
