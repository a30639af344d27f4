//! A session belongs to the principal that opened it (docs/SECURITY.md §3), on every backend
//! alike: another principal presenting its id — even one whose role includes `client` — is
//! refused `PERMISSION_DENIED` with `required_role` `session-owner`, and the session and its
//! lock are untouched.

use std::time::Duration;

use lock_api::{LockError, SESSION_OWNER_ROLE};
use lock_proto::v1::HeartbeatBatchRequest;
use lock_proto::v1::heartbeat_batch_result::Outcome;

use super::{Findings, LONG_TTL, Target};

/// Records a failure unless `result` is the refusal of `principal` for another's session.
fn expect_refused<T: std::fmt::Debug>(
    f: &mut Findings,
    what: &str,
    principal: &str,
    result: Result<T, LockError>,
) {
    let refused = matches!(
        &result,
        Err(LockError::PermissionDenied { principal: p, required_role })
            if p == principal && required_role == SESSION_OWNER_ROLE
    );
    f.check(refused, || {
        format!("{what} by {principal:?} on another's session answered {result:?}")
    });
}

/// `client` opens a session and takes a key; `operator` (whose role includes client's)
/// presents that session to every call that takes one — at another node where there is one —
/// and each is refused; then the lock is still `client`'s, with its token, on every node, and
/// `client` can still renew it.
pub async fn session_hijack(t: &mut Target) {
    let mut f = Findings::new(t, "session hijack");
    let owner = t.node_as(0, "client").await;
    let other = t.node_as(1, "operator").await;
    let session = owner
        .open_session(&t.owner("bound"), LONG_TTL)
        .await
        .expect("open");
    let key = t.key("hijack", 0);
    let grant = owner
        .try_acquire(&session.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let (id, token) = (session.id.as_str(), grant.fencing_token);
    let me = "operator";
    expect_refused(&mut f, "Heartbeat", me, other.heartbeat(id).await);
    expect_refused(&mut f, "LocksOf", me, other.locks_of(id).await);
    expect_refused(
        &mut f,
        "Renew",
        me,
        other.renew(id, &key, token, LONG_TTL).await,
    );
    expect_refused(&mut f, "Release", me, other.release(id, &key, token).await);
    let elsewhere = t.key("hijack", 1);
    expect_refused(
        &mut f,
        "TryAcquire",
        me,
        other.try_acquire(id, &elsewhere, LONG_TTL).await,
    );
    expect_refused(
        &mut f,
        "Acquire (waiting)",
        me,
        other
            .acquire(id, &key, LONG_TTL, Duration::from_secs(2))
            .await,
    );
    expect_refused(
        &mut f,
        "CancelAcquire",
        me,
        other.cancel_acquire(id, 1, &key).await,
    );
    expect_refused(&mut f, "CloseSession", me, other.close_session(id).await);
    // The operator's own session carries no right to the client's grant either.
    let own = other
        .open_session(&t.owner("other"), LONG_TTL)
        .await
        .expect("open own");
    expect_refused(
        &mut f,
        "Release via own session",
        me,
        other.release(&own.id, &key, token).await,
    );
    let batch = other
        .session_service()
        .heartbeat_batch(HeartbeatBatchRequest {
            session_ids: vec![session.id.clone(), own.id.clone()],
        })
        .await
        .map(|r| r.into_inner().results);
    match batch {
        Ok(results) if results.len() == 2 => {
            let entry = match &results[0].outcome {
                Some(Outcome::Error(detail)) => {
                    Err(lock_proto::error::lock_error_from_detail(detail.clone()))
                }
                other => Ok(other.clone()),
            };
            expect_refused(&mut f, "HeartbeatBatch entry", me, entry);
            f.check(
                matches!(&results[1].outcome, Some(Outcome::Heartbeat(h)) if h.alive),
                || format!("the operator's own batch entry answered {:?}", results[1]),
            );
        }
        other => f.fail(format!("HeartbeatBatch answered {other:?}")),
    }

    for i in 0..t.serving_nodes() {
        match t.inspect_at(i, &key).await {
            Some(info) => {
                f.check(
                    info.fencing_token == token && info.session_id == session.id,
                    || format!("node {i}: after the refusals Inspect shows {info:?}"),
                );
            }
            None => f.fail(format!(
                "node {i}: the client's lock is gone after the refusals"
            )),
        }
    }
    let renewed = owner.renew(id, &key, token, LONG_TTL).await;
    f.check(
        matches!(&renewed, Ok(Some(g)) if g.fencing_token == token),
        || format!("the owner's renew after the refusals answered {renewed:?}"),
    );
    f.check(owner.heartbeat(id).await.unwrap_or(false), || {
        "the owner's session is not alive after the refusals".to_owned()
    });
    let _ = owner.close_session(id).await;
    let _ = other.close_session(&own.id).await;
    f.finish();
}
