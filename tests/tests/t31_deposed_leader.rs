//! A leader cut off from the rest of the cluster keeps believing it leads until it hears of
//! its successor: its promote applied in its term, so it passes every local readiness check.
//! Its lease keeper knows nothing made after the cut. Whatever it answers meanwhile must not
//! be a terminal verdict taken from that stale state: a renewal of a grant the successor made
//! is never "lost" there, and a heartbeat of a session opened at the successor is never "gone".
//! Both must be retry-safe errors, so the client's retry at the real leader succeeds.
//!
//! Found by the combined 30-minute fault run of `lock-jepsen` (issue 22): a renewal answered
//! "lost" 0.3 s before its grant's deadline, by a leader that could not confirm its leadership,
//! while its successor still held the grant.

use std::time::Duration;

use lock_proto::v1::Role;
use lock_tests::{Cluster, ClusterConfig, poll_until};

/// How long a condition the cluster converges to may take on a loaded machine.
const CONDITION_WAIT: Duration = Duration::from_secs(30);

/// Lease of the grant and the session: long enough that nothing expires during the test.
const TTL: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_never_answers_lost_or_gone_for_what_it_has_not_seen() {
    let mut cluster = Cluster::start_with(ClusterConfig {
        proxied_links: true,
        ..ClusterConfig::default()
    })
    .await;
    let old = cluster.leader().await;
    let old_term = cluster
        .client(old)
        .status()
        .await
        .expect("status")
        .current_term;
    cluster.isolate(old);

    let others: Vec<(u64, lock_tests::NodeClient)> = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != old)
        .map(|id| (id, cluster.client(id)))
        .collect();
    let new = poll_until(
        "a leader among the others, in a later term",
        CONDITION_WAIT,
        || {
            let others = others.clone();
            async move {
                for (id, client) in &others {
                    if let Ok(s) = client.status().await
                        && s.role() == Role::Leader
                        && s.current_term > old_term
                    {
                        return Ok(*id);
                    }
                }
                Err("no new leader yet".to_owned())
            }
        },
    )
    .await
    .unwrap();
    // The premise: the cut-off node still believes it leads (it has heard of no later term).
    let stale = cluster.client(old);
    let seen = stale
        .status()
        .await
        .expect("the cut-off node answers clients");
    assert_eq!(seen.role(), Role::Leader, "{seen:?}");
    assert_eq!(seen.current_term, old_term, "{seen:?}");

    // A session and a grant made at the successor, after the cut.
    let leader = cluster.client(new);
    let session = poll_until("a session at the new leader", CONDITION_WAIT, || {
        let leader = leader.clone();
        async move {
            leader
                .open_session("t31-holder", TTL)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await
    .unwrap();
    let grant = leader
        .try_acquire(&session.id, "t31/k", TTL)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");

    match stale
        .renew(&session.id, "t31/k", grant.fencing_token, TTL)
        .await
    {
        Ok(None) => panic!("the deposed leader answered the renewal of a live grant lost"),
        Ok(Some(g)) => panic!("the deposed leader renewed a grant it never saw: {g:?}"),
        Err(e) => assert!(e.is_retry_safe(), "not retry-safe: {e}"),
    }
    match stale.heartbeat(&session.id).await {
        Ok(false) => panic!("the deposed leader answered a live session's heartbeat: gone"),
        Ok(true) => panic!("the deposed leader kept alive a session it never saw"),
        Err(e) => assert!(e.is_retry_safe(), "not retry-safe: {e}"),
    }

    // The retry at the real leader: both still alive.
    let renewed = leader
        .renew(&session.id, "t31/k", grant.fencing_token, TTL)
        .await
        .expect("renew at the leader");
    assert_eq!(
        renewed.map(|g| g.fencing_token),
        Some(grant.fencing_token),
        "the grant is held"
    );
    assert!(leader.heartbeat(&session.id).await.expect("heartbeat"));
    cluster.heal();
}
