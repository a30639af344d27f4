//! Cases on what the server reports: `Inspect` names the holder's owner and session, every
//! node showing the same; `OpenSession` and `Heartbeat` answer the TTL the session really has;
//! `ForceRevoke` answers a token floor that every later grant exceeds (INV-04).

use std::time::Duration;

use lock_proto::v1::heartbeat_batch_result::Outcome;
use lock_proto::v1::{HeartbeatBatchRequest, HeartbeatRequest, OpenSessionRequest};
use lock_tests::ms;

use lock_tests::pki::HARNESS_IDENTITY;

use super::{Findings, LONG_TTL, Target};

/// A session TTL every backend keeps exactly as asked (whole seconds, above every minimum).
const WHOLE_SECONDS_TTL: Duration = Duration::from_secs(5);

/// A session TTL that is not whole seconds: kept as asked on Raft, rounded up where the
/// backend declares a coarser step ([`super::Differences::session_ttl_step`]).
const ODD_TTL: Duration = Duration::from_millis(1_500);

/// `Inspect` of a held key, at every serving node, shows the grant's token, the owner the
/// session was opened for, and the session itself.
pub async fn inspect_holder(t: &mut Target) {
    let mut f = Findings::new(t, "inspect holder");
    let owner = t.owner("inspected-owner");
    let session = t.any().open_session(&owner, LONG_TTL).await.expect("open");
    let key = t.key("inspect", 0);
    let grant = t
        .node(0)
        .await
        .try_acquire(&session.id, &key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    f.check(
        grant.owner_id == owner && grant.session_id == session.id,
        || {
            format!(
                "the grant names owner {:?} and session {:?}",
                grant.owner_id, grant.session_id
            )
        },
    );
    for i in 0..t.serving_nodes() {
        let Some(info) = t.inspect_at(i, &key).await else {
            f.fail(format!(
                "Inspect at serving node {i} shows the held key free"
            ));
            continue;
        };
        f.check(info.fencing_token == grant.fencing_token, || {
            format!(
                "node {i}: Inspect shows token {}, the grant has {}",
                info.fencing_token, grant.fencing_token
            )
        });
        f.check(info.owner_id == owner, || {
            format!(
                "node {i}: Inspect shows owner_id {:?}; the holder is {owner:?}",
                info.owner_id
            )
        });
        f.check(info.session_id == session.id, || {
            format!(
                "node {i}: Inspect shows session_id {:?}; the holder's session is {:?}",
                info.session_id, session.id
            )
        });
        f.check(info.expires_at_unix_ms > info.acquired_at_unix_ms, || {
            format!("node {i}: Inspect shows a lease that expires before it began: {info:?}")
        });
    }
    f.finish();
}

/// `OpenSession` answers the TTL the backend keeps for the asked one, and `Heartbeat` (and
/// `HeartbeatBatch`) answer that same TTL — for a whole-seconds TTL every backend keeps as
/// asked, and for one that is not.
pub async fn heartbeat_ttl(t: &mut Target) {
    let mut f = Findings::new(t, "heartbeat ttl");
    for (n, asked) in [WHOLE_SECONDS_TTL, ODD_TTL].into_iter().enumerate() {
        let kept = t.differences.session_ttl_kept(asked);
        let mut opener = t.node(n).await.session_service();
        let opened = opener
            .open_session(OpenSessionRequest {
                owner_id: t.owner("heartbeater"),
                ttl_ms: ms(asked),
            })
            .await
            .expect("OpenSession")
            .into_inner();
        f.check(opened.ttl_ms == ms(kept), || {
            format!(
                "OpenSession asked for {} ms answered ttl_ms {}; the backend keeps {} ms",
                ms(asked),
                opened.ttl_ms,
                ms(kept)
            )
        });
        let mut beater = t.node(n + 1).await.session_service();
        let beat = beater
            .heartbeat(HeartbeatRequest {
                session_id: opened.session_id.clone(),
            })
            .await
            .expect("Heartbeat")
            .into_inner();
        f.check(beat.alive && beat.ttl_ms == opened.ttl_ms, || {
            format!(
                "Heartbeat of a live session of TTL {} ms answered alive={} ttl_ms={}",
                opened.ttl_ms, beat.alive, beat.ttl_ms
            )
        });
        let batch = beater
            .heartbeat_batch(HeartbeatBatchRequest {
                session_ids: vec![opened.session_id.clone()],
            })
            .await
            .expect("HeartbeatBatch")
            .into_inner();
        match batch.results.as_slice() {
            [result] => match &result.outcome {
                Some(Outcome::Heartbeat(b)) => {
                    f.check(b.alive && b.ttl_ms == opened.ttl_ms, || {
                        format!(
                            "HeartbeatBatch of a live session of TTL {} ms answered alive={} ttl_ms={}",
                            opened.ttl_ms, b.alive, b.ttl_ms
                        )
                    });
                }
                other => f.fail(format!("HeartbeatBatch answered {other:?}")),
            },
            other => f.fail(format!("HeartbeatBatch of one session answered {other:?}")),
        }
        let closed = t.any().close_session(&opened.session_id).await;
        f.check(closed.is_ok(), || {
            format!("CloseSession answered {closed:?}")
        });
    }
    f.finish();
}

/// `ForceRevoke` of a held key answers the revoked grant (owner, token) and a floor at least
/// that token; of a free key, nothing revoked. Either way the next grant's token exceeds the
/// floor.
pub async fn revoke_floor(t: &mut Target) {
    let mut f = Findings::new(t, "revoke floor");
    let any = t.any();
    let owner = t.owner("revoked-owner");
    let session = any.open_session(&owner, LONG_TTL).await.expect("open");
    let held_key = t.key("revoke-floor", 0);
    let free_key = t.key("revoke-floor", 1);
    let old = t
        .node(0)
        .await
        .try_acquire(&session.id, &held_key, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    for (key, held) in [(&held_key, true), (&free_key, false)] {
        let outcome = t
            .node(0)
            .await
            .force_revoke(key, HARNESS_IDENTITY, "conformance: floor")
            .await
            .expect("force_revoke");
        if held {
            f.check(
                outcome.revoked
                    && outcome.previous_token == old.fencing_token
                    && outcome.previous_owner_id == owner
                    && outcome.new_token_floor >= old.fencing_token,
                || {
                    format!(
                        "the revoke of a held key (token {}) answered {outcome:?}",
                        old.fencing_token
                    )
                },
            );
        } else {
            f.check(!outcome.revoked && outcome.previous_token == 0, || {
                format!("the revoke of a free key answered {outcome:?}")
            });
        }
        let next = t
            .node(1)
            .await
            .try_acquire(&session.id, key, LONG_TTL)
            .await
            .expect("try_acquire")
            .expect("the key is free after the revoke");
        f.check(next.fencing_token > outcome.new_token_floor, || {
            format!(
                "the grant after a revoke has token {}, not above the floor {} the revoke answered",
                next.fencing_token, outcome.new_token_floor
            )
        });
    }
    f.finish();
}
