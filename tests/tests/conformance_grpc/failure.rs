//! Cases on failures: a session that stops heartbeating dies with its TTL, never before, and
//! its grant goes to the next waiter (FR-04); a transient fault — a crashed node, a lost
//! leader, a database the nodes cannot reach — is never reported to the SDK as a lost lock
//! while the grant is really held (docs/DESIGN.md D-errors).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_client::{ClientConfig, LockError, LockHandle};
use lock_tests::wait::POLL_INTERVAL;

use super::{ANSWER_WAIT, Findings, LONG_TTL, Target, WAITER_MAX_WAIT};

/// The TTL of the session that dies: short so the case is quick, well above the election
/// timeout, and whole seconds, so etcd keeps it as asked.
const DYING_SESSION_TTL: Duration = Duration::from_secs(2);

/// How many grants the session holds through the fault.
const HELD_THROUGH_FAULT: usize = 3;

/// The SDK's call budget in the fault case: short, so a renewal during an outage answers
/// `Contention` quickly, and long enough to ride out a Raft failover.
const FAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long after the heal every renewal must succeed again: a restart of a node, an election
/// and a database reconnection on two loaded cores.
const RECOVERY_WAIT: Duration = Duration::from_secs(30);

/// A raw session that stops heartbeating holds a key an SDK session waits for: the key goes to
/// the waiter, inside its one blocking acquire, no earlier than the session's TTL after its
/// last heartbeat; the dead session then answers `alive = false` and its grant cannot be
/// renewed.
pub async fn session_death(t: &mut Target) {
    let mut f = Findings::new(t, "session death");
    let any = t.any();
    let key = t.key("session-death", 0);
    let doomed = t
        .node(0)
        .await
        .open_session(&t.owner("doomed"), DYING_SESSION_TTL)
        .await
        .expect("open the doomed session");
    // The grant outlives the session: only the session's death can free the key.
    let held = t
        .node(0)
        .await
        .try_acquire(&doomed.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let client = t.sdk(ClientConfig::default()).await;
    let waiter = Arc::new(
        client
            .open_session(&t.owner("heir"))
            .await
            .expect("SDK open_session"),
    );
    // The last heartbeat: the session cannot end before its TTL counted from this send.
    let last_heartbeat_sent = Instant::now();
    let alive = t
        .node(1)
        .await
        .heartbeat(&doomed.id)
        .await
        .expect("heartbeat");
    assert!(alive, "the doomed session is alive at its last heartbeat");
    let pending = {
        let waiter = Arc::clone(&waiter);
        let key = key.clone();
        tokio::spawn(async move {
            let answer = waiter.acquire(&key, LONG_TTL, WAITER_MAX_WAIT).await;
            (answer, Instant::now())
        })
    };
    let answered = tokio::time::timeout(WAITER_MAX_WAIT + ANSWER_WAIT, pending)
        .await
        .expect("the waiter answers within its max_wait")
        .expect("the waiter task did not panic");
    match answered {
        (Ok(Some(handle)), granted_at) => {
            let after = granted_at - last_heartbeat_sent;
            println!(
                "{}: session of TTL {:?} died; the waiter was granted {after:?} after its last \
                 heartbeat",
                t.name, doomed.ttl
            );
            f.check(after >= doomed.ttl, || {
                format!(
                    "the key was handed over {after:?} after the holder's last heartbeat, before \
                     its session TTL {:?}",
                    doomed.ttl
                )
            });
            f.check(handle.fencing_token > held.fencing_token, || {
                format!(
                    "the heir's token {} is not above the dead holder's {}",
                    handle.fencing_token, held.fencing_token
                )
            });
            f.check(handle.session_id == waiter.session_id(), || {
                format!("the heir's grant names session {:?}", handle.session_id)
            });
        }
        (other, _) => f.fail(format!(
            "the waiter's acquire answered {other:?}, not a grant"
        )),
    }
    let beat = any.heartbeat(&doomed.id).await;
    f.check(beat == Ok(false), || {
        format!("a heartbeat of the dead session answered {beat:?}; it is gone for good")
    });
    let renew = any
        .renew(&doomed.id, &key, held.fencing_token, LONG_TTL)
        .await;
    f.check(
        matches!(
            renew,
            Ok(None) | Err(LockError::LockLost { .. }) | Err(LockError::InvalidArgument { .. })
        ),
        || format!("renewing the dead session's grant answered {renew:?}"),
    );
    f.finish();
}

/// Whether `answer` to a renewal of `handle` is one a held grant may get during a transient
/// fault: renewed (same token), or a retry-safe error. `None` or `LockLost` is a lie.
fn renew_is_honest(handle: &LockHandle, answer: &Result<Option<LockHandle>, LockError>) -> bool {
    match answer {
        Ok(Some(renewed)) => renewed.fencing_token == handle.fencing_token,
        Err(LockError::Contention { .. } | LockError::NotLeader { .. }) => true,
        _ => false,
    }
}

/// An SDK session holds three grants; a transient fault strikes ([`Target::fault`]); renewals
/// during it either renew or fail retry-safe, never "lost"; after the heal every renewal
/// succeeds, the server shows each grant with its token, the session is alive and no
/// lost-lock listener fired.
pub async fn transient_fault(t: &mut Target) {
    let mut f = Findings::new(t, "transient fault");
    let config = ClientConfig {
        call_timeout: FAULT_CALL_TIMEOUT,
        // Far longer than the fault, so only a lie can end the grants.
        session_ttl: LONG_TTL,
        ..ClientConfig::default()
    };
    let client = t.sdk(config).await;
    let session = client
        .open_session(&t.owner("survivor"))
        .await
        .expect("SDK open_session");
    let lost = Arc::new(AtomicUsize::new(0));
    {
        let lost = Arc::clone(&lost);
        session.on_lock_lost(move |_| {
            lost.fetch_add(1, Ordering::SeqCst);
        });
    }
    let mut handles = Vec::new();
    for n in 0..HELD_THROUGH_FAULT {
        let key = t.key("transient", n);
        let handle = session
            .try_acquire(&key, LONG_TTL)
            .await
            .expect("try_acquire")
            .expect("a fresh key is free");
        handles.push(handle);
    }

    let fault = t.fault().await;
    println!("{}: fault: {fault}", t.name);
    let during = tokio::join!(
        session.renew(&handles[0]),
        session.renew(&handles[1]),
        session.renew(&handles[2]),
    );
    for (handle, answer) in handles.iter().zip([during.0, during.1, during.2]) {
        println!(
            "{}: renew of {} during the fault: {answer:?}",
            t.name, handle.key
        );
        f.check(renew_is_honest(handle, &answer), || {
            format!(
                "during the fault ({fault}) a renewal of the held grant {} (token {}) answered \
                 {answer:?}: a transient failure reported as lost",
                handle.key, handle.fencing_token
            )
        });
    }
    t.heal().await;

    for handle in &handles {
        let deadline = Instant::now() + RECOVERY_WAIT;
        loop {
            let answer = session.renew(handle).await;
            if !renew_is_honest(handle, &answer) {
                f.fail(format!(
                    "after the heal a renewal of the held grant {} answered {answer:?}",
                    handle.key
                ));
                break;
            }
            if matches!(answer, Ok(Some(_))) {
                break;
            }
            if Instant::now() >= deadline {
                f.fail(format!(
                    "no renewal of {} succeeded within {RECOVERY_WAIT:?} of the heal; the last \
                     answered {answer:?}",
                    handle.key
                ));
                break;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
    for (n, handle) in handles.iter().enumerate() {
        let info = t.inspect_at(n, &handle.key).await;
        f.check(
            info.as_ref().map(|i| i.fencing_token) == Some(handle.fencing_token),
            || {
                format!(
                    "after the heal {} shows {info:?}; the session held it with token {}",
                    handle.key, handle.fencing_token
                )
            },
        );
    }
    f.check(session.is_alive(), || {
        "the SDK session is dead after a transient fault".to_owned()
    });
    let fired = lost.load(Ordering::SeqCst);
    f.check(fired == 0, || {
        format!("the lost-lock listener fired {fired} time(s) for grants that were held")
    });
    if let Err(e) = session.close().await {
        println!("{}: close after the fault: {e}", t.name);
    }
    f.finish();
}
