//! Cases on retried requests (docs/DESIGN.md D-idempotency): a mutating request sent again
//! with the same `(session_id, request_id)` — as a client does when the first answer was lost
//! — is answered what the first one was answered and is not applied twice. Raw stubs, since the
//! SDK never lets a caller choose a request id. Where there are several nodes the retry goes to
//! another one, as a client's retry after a lost connection may.

use std::time::Duration;

use lock_tests::next_request_id;
use lock_tests::pki::HARNESS_IDENTITY;

use super::{Findings, LONG_TTL, Target};

/// `max_wait` of the acquires here: the key is free, so the first is granted at once; a
/// server that does not remember the first grant makes the retry wait this long and then
/// answer "not granted".
const ACQUIRE_MAX_WAIT: Duration = Duration::from_secs(2);

/// The lease a renewal asks for: different from the grant's, so a renewal is visible.
const RENEW_TTL: Duration = Duration::from_secs(45);

/// An `Acquire` and a `TryAcquire`, each sent twice with one request id: the retry answers the
/// same grant (same token), the key holds that one grant, and the session holds the key once.
pub async fn acquire(t: &mut Target) {
    let mut f = Findings::new(t, "retried acquire");
    let any = t.any();
    let session = any
        .open_session(&t.owner("retrier"), LONG_TTL)
        .await
        .expect("open");
    for (n, blocking) in [(0, true), (1, false)] {
        let call = if blocking { "Acquire" } else { "TryAcquire" };
        let key = t.key("retry-acquire", n);
        let request_id = next_request_id();
        let send = |node: lock_tests::NodeClient| {
            let (session, key) = (session.id.clone(), key.clone());
            async move {
                if blocking {
                    node.acquire_with_request_id(
                        &session,
                        request_id,
                        &key,
                        LONG_TTL,
                        ACQUIRE_MAX_WAIT,
                    )
                    .await
                } else {
                    node.try_acquire_with_request_id(&session, request_id, &key, LONG_TTL)
                        .await
                }
            }
        };
        let first = send(t.node(0).await)
            .await
            .unwrap_or_else(|e| panic!("{call}: {e}"))
            .unwrap_or_else(|| panic!("{call} of a fresh key is granted"));
        let retry = send(t.node(1).await).await;
        match &retry {
            Ok(Some(again)) => {
                f.check(again.fencing_token == first.fencing_token, || {
                    format!(
                        "the retried {call} answered token {}; the first answered {}: a \
                         second grant",
                        again.fencing_token, first.fencing_token
                    )
                });
            }
            other => f.fail(format!(
                "the retried {call} (same request id) answered {other:?}; the first answered \
                 the grant {first:?}"
            )),
        }
        let info = t.inspect_at(0, &key).await;
        f.check(
            info.as_ref().map(|i| i.fencing_token) == Some(first.fencing_token),
            || format!("after the retried {call} the key shows {info:?}, not the first grant"),
        );
    }
    let locks = any.locks_of(&session.id).await.expect("LocksOf");
    let keys = vec![t.key("retry-acquire", 0), t.key("retry-acquire", 1)];
    f.check(locks == keys, || {
        format!("the session holds {locks:?}; it acquired {keys:?}, each once")
    });
    f.finish();
}

/// A `Renew` sent twice with one request id answers the same grant both times: same token,
/// the new lease length.
pub async fn renew(t: &mut Target) {
    let mut f = Findings::new(t, "retried renew");
    let any = t.any();
    let session = any
        .open_session(&t.owner("renewer"), LONG_TTL)
        .await
        .expect("open");
    let key = t.key("retry-renew", 0);
    let grant = t
        .node(0)
        .await
        .try_acquire(&session.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let request_id = next_request_id();
    for attempt in ["the renewal", "its retry"] {
        let node = t.node(usize::from(attempt != "the renewal")).await;
        let answer = node
            .renew_with_request_id(
                &session.id,
                request_id,
                &key,
                grant.fencing_token,
                RENEW_TTL,
            )
            .await;
        match answer {
            Ok(Some(renewed)) => {
                f.check(renewed.fencing_token == grant.fencing_token, || {
                    format!(
                        "{attempt} answered token {}; the grant has {}",
                        renewed.fencing_token, grant.fencing_token
                    )
                });
                f.check(renewed.ttl_ms == lock_tests::ms(RENEW_TTL), || {
                    format!(
                        "{attempt} answered ttl_ms {}; it asked for {}",
                        renewed.ttl_ms,
                        lock_tests::ms(RENEW_TTL)
                    )
                });
            }
            other => f.fail(format!("{attempt} of a held grant answered {other:?}")),
        }
    }
    let info = t.inspect_at(1, &key).await;
    f.check(
        info.as_ref().map(|i| i.fencing_token) == Some(grant.fencing_token),
        || format!("after the renewals the key shows {info:?}"),
    );
    f.finish();
}

/// A `Release` answered `true` and then sent again with the same request id answers `true`
/// again (the remembered answer) — after the same session acquired the key again with another
/// request, and without releasing that later grant.
pub async fn release(t: &mut Target) {
    let mut f = Findings::new(t, "retried release");
    let any = t.any();
    let session = any
        .open_session(&t.owner("releaser"), LONG_TTL)
        .await
        .expect("open");
    let key = t.key("retry-release", 0);
    let first = t
        .node(0)
        .await
        .try_acquire(&session.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let request_id = next_request_id();
    let released = t
        .node(0)
        .await
        .release_with_request_id(&session.id, request_id, &key, first.fencing_token)
        .await
        .expect("release");
    f.check(released, || {
        "releasing a held grant answered false".to_owned()
    });
    let later = t
        .node(1)
        .await
        .try_acquire(&session.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("the released key is free again");
    let retry = t
        .node(1)
        .await
        .release_with_request_id(&session.id, request_id, &key, first.fencing_token)
        .await;
    f.check(retry == Ok(true), || {
        format!("the retried release (same request id) answered {retry:?}; the first answered true")
    });
    let info = t.inspect_at(0, &key).await;
    f.check(
        info.as_ref().map(|i| i.fencing_token) == Some(later.fencing_token),
        || {
            format!(
                "the retried release left the key {info:?}; the later grant (token {}) must stay",
                later.fencing_token
            )
        },
    );
    f.finish();
}

/// A `ForceRevoke` sent twice with one request id revokes once: the retry answers the first
/// outcome (same previous token, same new floor) and leaves the grant made in between alone.
pub async fn force_revoke(t: &mut Target) {
    let mut f = Findings::new(t, "retried force_revoke");
    let any = t.any();
    let displaced = any
        .open_session(&t.owner("displaced"), LONG_TTL)
        .await
        .expect("open");
    let next = any
        .open_session(&t.owner("next"), LONG_TTL)
        .await
        .expect("open");
    let key = t.key("retry-revoke", 0);
    let old = t
        .node(0)
        .await
        .try_acquire(&displaced.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let request_id = next_request_id();
    let first = t
        .node(0)
        .await
        .force_revoke_with_request_id(
            &key,
            HARNESS_IDENTITY,
            "conformance: stuck holder",
            request_id,
        )
        .await
        .expect("force_revoke");
    f.check(
        first.revoked && first.previous_token == old.fencing_token,
        || format!("the revoke of a held key answered {first:?}"),
    );
    let new = t
        .node(1)
        .await
        .try_acquire(&next.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("the revoked key is free");
    let retry = t
        .node(1)
        .await
        .force_revoke_with_request_id(
            &key,
            HARNESS_IDENTITY,
            "conformance: stuck holder",
            request_id,
        )
        .await
        .expect("the retried force_revoke answers");
    f.check(retry == first, || {
        format!("the retried revoke answered {retry:?}; the first answered {first:?}")
    });
    let info = t.inspect_at(0, &key).await;
    f.check(
        info.as_ref().map(|i| i.fencing_token) == Some(new.fencing_token),
        || {
            format!(
                "the retried revoke (same request id) revoked the next holder: the key shows \
                 {info:?}, the grant made in between has token {}",
                new.fencing_token
            )
        },
    );
    f.finish();
}
