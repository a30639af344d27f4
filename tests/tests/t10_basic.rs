//! Basic behaviour of a healthy cluster: leader election, `NotLeader` redirection from
//! followers, grants and their fencing tokens, exclusivity, release, inspect.
//!
//! Every test starts its own cluster; nothing here injects faults (see `t30_faults`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_tests::pki::HARNESS_IDENTITY;
use lock_tests::{Cluster, ClusterConfig, LockError, Role, poll_until};

/// Lease of grants and sessions that must not expire during a test.
const LONG_TTL: Duration = Duration::from_secs(60);

/// Asserts that `err` is `NotLeader` naming `leader` by id and by the address the harness
/// gave it (`--listen`, the `host:port` of the leader's endpoint).
fn assert_not_leader_naming(cluster: &Cluster, err: &LockError, leader: u64, what: &str) {
    match err {
        LockError::NotLeader {
            leader_id: Some(id),
            leader_addr: Some(addr),
        } => {
            assert_eq!(
                *id, leader,
                "{what}: NotLeader names node {id}, the leader is {leader}"
            );
            assert_eq!(
                *addr,
                cluster.addr(leader),
                "{what}: NotLeader names address {addr:?} for leader {leader}"
            );
        }
        other => panic!("{what}: expected NotLeader naming node {leader}, got {other:?}"),
    }
}

fn unix_ms_now() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    lock_tests::ms(since)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_one_leader_and_agree_on_membership() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut cluster_ids = Vec::new();
    for id in cluster.ids() {
        let status = cluster.status(id).await.expect("Status answers");
        assert_eq!(status.node_id, id, "node {id} reports its own id");
        assert_eq!(status.leader_id, Some(leader), "node {id}'s leader");
        assert_eq!(
            status.leader_addr,
            cluster.addr(leader),
            "node {id}'s leader address"
        );
        let role = status.role();
        if id == leader {
            assert_eq!(role, Role::Leader, "node {id} is the leader");
        } else {
            assert_eq!(role, Role::Follower, "node {id} follows");
        }
        assert!(
            status.current_term >= 1,
            "node {id} term {}",
            status.current_term
        );
        assert!(
            status.applied_index <= status.last_log_index,
            "node {id} applied {} past its last log index {}",
            status.applied_index,
            status.last_log_index
        );
        let mut members: Vec<(u64, String, bool)> = status
            .members
            .iter()
            .map(|m| (m.node_id, m.addr.clone(), m.voter))
            .collect();
        members.sort();
        let expected: Vec<(u64, String, bool)> = cluster
            .ids()
            .into_iter()
            .map(|n| (n, cluster.addr(n), true))
            .collect();
        assert_eq!(members, expected, "node {id}'s membership");
        assert!(
            !status.cluster_id.is_empty(),
            "node {id} has no cluster id after init"
        );
        cluster_ids.push(status.cluster_id);
    }
    cluster_ids.dedup();
    assert_eq!(
        cluster_ids.len(),
        1,
        "nodes disagree on the cluster id: {cluster_ids:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_not_leader_naming_the_leader() {
    let mut cluster = Cluster::start(3).await;
    let session = cluster
        .cluster_client()
        .open_session("t10-owner", LONG_TTL)
        .await
        .expect("open a session at the leader");
    let grant = cluster
        .cluster_client()
        .try_acquire(&session.id, "held", LONG_TTL)
        .await
        .expect("try_acquire at the leader")
        .expect("a free key is granted");
    let leader = cluster.leader().await;
    for follower in cluster.followers().await {
        let at = cluster.client(follower);
        let what = |op: &str| format!("{op} at follower {follower}");
        let err = at
            .acquire(&session.id, "k", LONG_TTL, Duration::ZERO)
            .await
            .expect_err("a follower must not grant");
        assert_not_leader_naming(&cluster, &err, leader, &what("Acquire"));
        let err = at
            .try_acquire(&session.id, "k", LONG_TTL)
            .await
            .expect_err("a follower must not grant");
        assert_not_leader_naming(&cluster, &err, leader, &what("TryAcquire"));
        let err = at.open_session("o", LONG_TTL).await.expect_err("follower");
        assert_not_leader_naming(&cluster, &err, leader, &what("OpenSession"));
        let err = at.heartbeat(&session.id).await.expect_err("follower");
        assert_not_leader_naming(&cluster, &err, leader, &what("Heartbeat"));
        let err = at
            .renew(&session.id, "held", grant.fencing_token, LONG_TTL)
            .await
            .expect_err("follower");
        assert_not_leader_naming(&cluster, &err, leader, &what("Renew"));
        let err = at
            .release(&session.id, "held", grant.fencing_token)
            .await
            .expect_err("follower");
        assert_not_leader_naming(&cluster, &err, leader, &what("Release"));
        let err = at
            .force_revoke("held", HARNESS_IDENTITY, "test")
            .await
            .expect_err("follower");
        assert_not_leader_naming(&cluster, &err, leader, &what("ForceRevoke"));
        let err = at.inspect("held", true).await.expect_err("follower");
        assert_not_leader_naming(&cluster, &err, leader, &what("Inspect(leader_confirmed)"));
    }
    // None of that touched the grant.
    let info = cluster
        .cluster_client()
        .inspect_confirmed("held")
        .await
        .expect("inspect at the leader")
        .expect("still held");
    assert_eq!(info.fencing_token, grant.fencing_token);
    assert_eq!(info.session_id, session.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_grants_with_a_token_and_the_grant_is_exclusive() {
    let mut cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let alice = any
        .open_session("alice", LONG_TTL)
        .await
        .expect("open alice");
    let bob = any.open_session("bob", LONG_TTL).await.expect("open bob");
    assert_ne!(alice.id, bob.id, "two sessions, two ids");
    assert_eq!(alice.ttl, LONG_TTL, "the session TTL asked for is granted");
    // Through the leader-following client: the answers are the leader's, and a transient
    // `Contention` on a loaded machine is retried rather than failing the test.
    let at_leader = any.clone();

    let before_ms = unix_ms_now();
    let grant = at_leader
        .acquire(&alice.id, "k", LONG_TTL, Duration::ZERO)
        .await
        .expect("acquire at the leader")
        .expect("a free key is granted");
    assert!(
        grant.fencing_token >= 1,
        "token {} must be >= 1",
        grant.fencing_token
    );
    assert_eq!(grant.key, "k");
    assert_eq!(grant.owner_id, "alice");
    assert_eq!(grant.session_id, alice.id);
    assert_eq!(grant.ttl_ms, lock_tests::ms(LONG_TTL));
    // Same machine, same wall clock: the display expiry is about now + ttl.
    let expiry = grant.server_expiry_unix_ms;
    assert!(
        expiry >= before_ms + grant.ttl_ms - 5_000
            && expiry <= unix_ms_now() + grant.ttl_ms + 5_000,
        "server expiry {expiry} is not about now ({before_ms}) + ttl {}",
        grant.ttl_ms
    );

    // Held: bob gets nothing, neither at once nor after a short wait, and the wait is honoured.
    let none = at_leader
        .try_acquire(&bob.id, "k", LONG_TTL)
        .await
        .expect("try_acquire");
    assert_eq!(
        none, None,
        "a held key must not be granted to another session"
    );
    let max_wait = Duration::from_millis(400);
    let started = Instant::now();
    let none = at_leader
        .acquire(&bob.id, "k", LONG_TTL, max_wait)
        .await
        .expect("acquire with a wait");
    assert_eq!(none, None, "a held key must not be granted after a wait");
    assert!(
        started.elapsed() >= max_wait,
        "answered 'not granted' after {:?}, before max_wait {max_wait:?}",
        started.elapsed()
    );

    let info = at_leader
        .inspect("k", true)
        .await
        .expect("inspect")
        .expect("k is held");
    assert_eq!(
        (
            info.owner_id.as_str(),
            info.session_id.as_str(),
            info.fencing_token,
            info.waiter_count
        ),
        ("alice", alice.id.as_str(), grant.fencing_token, 0)
    );
    assert!(info.acquired_at_unix_ms <= info.expires_at_unix_ms);
    assert_eq!(
        at_leader.locks_of(&alice.id).await.expect("locks_of"),
        vec!["k".to_owned()]
    );
    assert!(
        at_leader
            .locks_of(&bob.id)
            .await
            .expect("locks_of")
            .is_empty()
    );

    // Renewal keeps the token.
    let renewed = at_leader
        .renew(&alice.id, "k", grant.fencing_token, LONG_TTL)
        .await
        .expect("renew")
        .expect("alice still holds k");
    assert_eq!(renewed.fencing_token, grant.fencing_token);
    assert!(renewed.server_expiry_unix_ms >= grant.server_expiry_unix_ms);

    // Release is compare-and-delete and idempotent.
    assert!(
        at_leader
            .release(&alice.id, "k", grant.fencing_token)
            .await
            .expect("release")
    );
    assert!(
        !at_leader
            .release(&alice.id, "k", grant.fencing_token)
            .await
            .expect("release again")
    );
    assert_eq!(at_leader.inspect("k", true).await.expect("inspect"), None);

    let second = at_leader
        .try_acquire(&bob.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("a released key is free");
    assert!(
        second.fencing_token > grant.fencing_token,
        "token {} after {}",
        second.fencing_token,
        grant.fencing_token
    );

    // A follower read converges on the new holder.
    let follower = cluster.followers().await[0];
    let at_follower = cluster.client(follower);
    let token = second.fencing_token;
    poll_until(
        "a follower read to show bob's grant",
        Duration::from_secs(5),
        || {
            let at_follower = at_follower.clone();
            async move {
                match at_follower.inspect("k", false).await {
                    Ok(Some(info)) if info.fencing_token == token && info.owner_id == "bob" => {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .expect("follower read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_cluster_serves() {
    let mut cluster = Cluster::start(1).await;
    assert_eq!(cluster.leader().await, 1);
    let at = cluster.client(1);
    let session = cluster
        .cluster_client()
        .open_session("solo", LONG_TTL)
        .await
        .expect("open");
    let grant = at
        .try_acquire(&session.id, "solo-key", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    assert!(grant.fencing_token >= 1);
    assert!(
        at.release(&session.id, "solo-key", grant.fencing_token)
            .await
            .expect("release")
    );
    assert_eq!(at.close_session(&session.id).await.expect("close"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_elect_one_leader_and_serve() {
    let mut cluster = Cluster::start_with(ClusterConfig::with_nodes(5)).await;
    assert_eq!(cluster.followers().await.len(), 4);
    let any = cluster.cluster_client();
    let session = any.open_session("five", LONG_TTL).await.expect("open");
    let grant = any
        .try_acquire(&session.id, "k5", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let info = any
        .inspect_confirmed("k5")
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(info.fencing_token, grant.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_unique_and_follow_grant_order_under_contention() {
    /// Contending clients, each with its own session.
    const CLIENTS: usize = 4;
    /// Attempts per client.
    const ATTEMPTS: usize = 25;
    /// Keys the clients fight over: few, so most attempts contend.
    const KEYS: [&str; 2] = ["hot-a", "hot-b"];

    /// One grant as a client saw it: when it sent the acquire, when the grant arrived, when
    /// it sent the release.
    #[derive(Debug)]
    struct Held {
        key: &'static str,
        token: u64,
        acquire_sent: Instant,
        granted_at: Instant,
        release_sent: Instant,
    }

    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = cluster.cluster_client();
        let session = any
            .open_session(&format!("c{c}"), LONG_TTL)
            .await
            .expect("open");
        tasks.push(tokio::spawn(async move {
            let mut held = Vec::new();
            for i in 0..ATTEMPTS {
                let key = KEYS[(c + i) % KEYS.len()];
                let acquire_sent = Instant::now();
                let grant = client
                    .try_acquire(&session.id, key, LONG_TTL)
                    .await
                    .expect("try_acquire");
                if let Some(grant) = grant {
                    let granted_at = Instant::now();
                    let release_sent = Instant::now();
                    assert!(
                        client
                            .release(&session.id, key, grant.fencing_token)
                            .await
                            .expect("release"),
                        "{key}: the holder's release of token {} found it gone",
                        grant.fencing_token
                    );
                    held.push(Held {
                        key,
                        token: grant.fencing_token,
                        acquire_sent,
                        granted_at,
                        release_sent,
                    });
                }
            }
            held
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    assert!(
        all.len() >= CLIENTS,
        "only {} grants in {} attempts",
        all.len(),
        CLIENTS * ATTEMPTS
    );
    let mut tokens: Vec<u64> = all.iter().map(|h| h.token).collect();
    tokens.sort_unstable();
    let before = tokens.len();
    tokens.dedup();
    assert_eq!(tokens.len(), before, "a fencing token was issued twice");
    for key in KEYS {
        let mut grants: Vec<&Held> = all.iter().filter(|h| h.key == key).collect();
        grants.sort_by_key(|h| h.token);
        for pair in grants.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            // b was granted after a was freed, so a's release was sent before b's grant
            // arrived; and a's acquire was sent before b's grant arrived.
            assert!(
                a.release_sent < b.granted_at && a.acquire_sent < b.granted_at,
                "{key}: token {} ({a:?}) and token {} ({b:?}) are not in grant order",
                a.token,
                b.token
            );
        }
    }
    println!(
        "{} grants under contention, tokens {:?}..{:?}",
        all.len(),
        tokens.first(),
        tokens.last()
    );
}
