//! `SessionService.HeartbeatBatch` against real clusters: each session of a batch gets the
//! answer its own `Heartbeat` would get (alive, gone, lapsed and expired, malformed id), a batch
//! over the limit is refused naming it, a follower answers `NotLeader` naming the leader, and
//! the SDK keeps several sessions of one client alive with it.

use std::time::Duration;

use lock_client::{ClientConfig, LockClient, SafetyMargin, TlsConfig};
use lock_proto::lock_error_from_status;
use lock_proto::session::HEARTBEAT_BATCH_SESSIONS_MAX;
use lock_proto::v1::heartbeat_batch_result::Outcome;
use lock_proto::v1::{HeartbeatBatchRequest, HeartbeatBatchResult, HeartbeatResponse};
use lock_tests::{Cluster, LockError, NodeClient, poll_until};

/// Lease of the sessions that must stay alive during a test.
const LONG_TTL: Duration = Duration::from_secs(60);

/// Lease of the session a test lets expire: the contract's minimum plus a second, well above
/// the election timeout.
const SHORT_TTL: Duration = Duration::from_secs(2);

/// How long the expired session may take to be reaped: its TTL, the reaper cadence and a
/// commit on two loaded cores.
const EXPIRY_WAIT: Duration = Duration::from_secs(15);

/// Timeout of one raw call.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// One `HeartbeatBatch` call at `node`, its failure decoded as a client would.
async fn heartbeat_batch(
    node: &NodeClient,
    session_ids: Vec<String>,
) -> Result<Vec<HeartbeatBatchResult>, LockError> {
    let mut sessions = node.session_service();
    match tokio::time::timeout(
        RPC_TIMEOUT,
        sessions.heartbeat_batch(HeartbeatBatchRequest { session_ids }),
    )
    .await
    {
        Ok(Ok(answer)) => Ok(answer.into_inner().results),
        Ok(Err(status)) => Err(lock_error_from_status(&status)),
        Err(_) => Err(LockError::contention(format!(
            "HeartbeatBatch at {}: no answer within {RPC_TIMEOUT:?}",
            node.endpoint()
        ))),
    }
}

fn heartbeat(result: &HeartbeatBatchResult) -> &HeartbeatResponse {
    match &result.outcome {
        Some(Outcome::Heartbeat(h)) => h,
        other => panic!("expected a heartbeat answer, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_session_of_a_batch_gets_its_own_answer_and_the_limit_is_enforced() {
    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let live = any.open_session("live", LONG_TTL).await.expect("open live");
    let doomed = any
        .open_session("doomed", SHORT_TTL)
        .await
        .expect("open doomed");
    any.try_acquire(&doomed.id, "doomed-key", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    // Never heartbeated, the doomed session expires and its grant goes with it.
    poll_until("the doomed session's expiry", EXPIRY_WAIT, || {
        let any = any.clone();
        async move {
            match any.inspect("doomed-key", true).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await
    .expect("the unheartbeated session expires");

    let ids = vec![
        live.id.clone(),
        "0123456789abcdef0123456789abcdef".to_owned(),
        doomed.id.clone(),
        String::new(),
        live.id.clone(),
    ];
    let results = any
        .call(|node| {
            let ids = ids.clone();
            async move { heartbeat_batch(&node, ids).await }
        })
        .await
        .expect("HeartbeatBatch at the leader");
    assert_eq!(results.len(), ids.len(), "one result per id: {results:?}");
    let live_ttl_ms = u64::try_from(live.ttl.as_millis()).expect("ttl fits u64");
    assert_eq!(
        heartbeat(&results[0]),
        &HeartbeatResponse {
            alive: true,
            ttl_ms: live_ttl_ms
        },
        "the live session"
    );
    assert_eq!(
        heartbeat(&results[1]),
        &HeartbeatResponse {
            alive: false,
            ttl_ms: 0
        },
        "a session never opened"
    );
    assert_eq!(
        heartbeat(&results[2]),
        &HeartbeatResponse {
            alive: false,
            ttl_ms: 0
        },
        "the expired session"
    );
    match &results[3].outcome {
        Some(Outcome::Error(detail)) => assert!(
            matches!(
                lock_proto::error::lock_error_from_detail(detail.clone()),
                LockError::InvalidArgument { .. }
            ),
            "a blank id is an invalid argument: {detail:?}"
        ),
        other => panic!("a blank id must be that session's error, got {other:?}"),
    }
    assert!(
        heartbeat(&results[4]).alive,
        "a repeated id is answered again"
    );
    // The unary call agrees about every session.
    assert!(any.heartbeat(&live.id).await.expect("heartbeat live"));
    assert!(!any.heartbeat(&doomed.id).await.expect("heartbeat doomed"));

    // Exactly the limit is served; one more is refused as a whole, naming the limit.
    let full: Vec<String> = (0..HEARTBEAT_BATCH_SESSIONS_MAX)
        .map(|i| format!("{i:032x}"))
        .collect();
    let results = any
        .call(|node| {
            let full = full.clone();
            async move { heartbeat_batch(&node, full).await }
        })
        .await
        .expect("a batch of exactly the limit");
    assert_eq!(results.len(), HEARTBEAT_BATCH_SESSIONS_MAX);
    assert!(results.iter().all(|r| !heartbeat(r).alive));
    let mut over = full.clone();
    over.push(live.id.clone());
    let refused = any
        .call(|node| {
            let over = over.clone();
            async move { heartbeat_batch(&node, over).await }
        })
        .await;
    match refused {
        Err(LockError::InvalidArgument { message }) => {
            assert!(
                message.contains("HEARTBEAT_BATCH_SESSIONS_MAX")
                    && message.contains(&HEARTBEAT_BATCH_SESSIONS_MAX.to_string()),
                "the refusal names the limit: {message}"
            );
        }
        other => panic!("an oversized batch must be InvalidArgument, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_not_leader_naming_the_leader() {
    let mut cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let live = any.open_session("live", LONG_TTL).await.expect("open live");
    let leader = cluster.leader().await;
    let leader_addr = cluster.addr(leader);
    for follower in cluster.followers().await {
        let node = cluster.client(follower);
        // A follower that has not yet heard of the leader's term answers NotLeader without
        // a hint; poll until it names the leader.
        poll_until(
            &format!("node {follower} answering NotLeader naming {leader}"),
            Duration::from_secs(10),
            || {
                let node = node.clone();
                let ids = vec![live.id.clone()];
                let leader_addr = leader_addr.clone();
                async move {
                    match heartbeat_batch(&node, ids).await {
                        Err(LockError::NotLeader {
                            leader_id: Some(id),
                            leader_addr: Some(addr),
                        }) if id == leader && addr == leader_addr => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                }
            },
        )
        .await
        .expect("the follower refuses the batch");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_keeps_several_sessions_of_one_client_alive_past_their_ttl() {
    let cluster = Cluster::start(3).await;
    let ttl = Duration::from_secs(3);
    let (ca, cert, key) = cluster.sdk_tls("client");
    let config = ClientConfig {
        tls: Some(TlsConfig::new(ca).with_identity(cert, key)),
        session_ttl: ttl,
        safety_margin: SafetyMargin::Fixed(Duration::from_millis(200)),
        ..ClientConfig::default()
    };
    let client = LockClient::connect_with(&cluster.endpoints(), config)
        .await
        .expect("connect");
    let mut sessions = Vec::new();
    for i in 0..5 {
        sessions.push(
            client
                .open_session(&format!("sdk-{i}"))
                .await
                .expect("open session"),
        );
    }
    // A canary opened after them with the same TTL and never heartbeated: once the leader has
    // expired it (its grant is gone), the SDK's sessions, older, are alive only because they
    // were heartbeated.
    let any = cluster.cluster_client();
    let canary = any.open_session("canary", ttl).await.expect("open canary");
    any.try_acquire(&canary.id, "canary-key", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    poll_until("the canary session's expiry", EXPIRY_WAIT, || {
        let any = any.clone();
        async move {
            match any.inspect("canary-key", true).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await
    .expect("the unheartbeated canary expires");
    for session in &sessions {
        assert!(session.is_alive(), "{} died", session.session_id());
        assert!(
            any.heartbeat(session.session_id())
                .await
                .expect("unary heartbeat"),
            "the server lost {}",
            session.session_id()
        );
    }
    for session in sessions {
        session.close().await.expect("close");
    }
}
