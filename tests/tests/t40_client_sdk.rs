//! The Rust SDK (`lock-client`) against real three-node clusters: leader discovery from
//! followers only, a kept-alive handle surviving a leader failover, session death firing the
//! lost-lock listener, a dropped acquire leaving neither a waiter nor a grant behind, and the
//! crate's first program (`client/examples/first_program.rs`) doing what its page says.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_client::{ClientConfig, LockClient, LockError, LockHandle, TlsConfig};
use lock_tests::{Cluster, poll_until};

// The example itself, compiled into this test: what the crate's front page shows is what runs.
#[allow(dead_code)] // its `main` is the example's entry point, unused here
#[path = "../../client/examples/first_program.rs"]
mod first_program;

/// How long a test waits for the SDK or the cluster to react (heartbeat rounds, an election,
/// a commit) on two loaded cores.
const REACTION_MAX: Duration = Duration::from_secs(20);

/// A lease that does not run out during a test unless the test wants it to.
const LONG_TTL: Duration = Duration::from_secs(60);

/// The SDK over TLS as the `client` principal (a lock user's role) of `cluster`.
fn tls(cluster: &Cluster) -> Option<TlsConfig> {
    let (ca, cert, key) = cluster.sdk_tls("client");
    Some(TlsConfig::new(ca).with_identity(cert, key))
}

fn config(cluster: &Cluster) -> ClientConfig {
    ClientConfig {
        tls: tls(cluster),
        // Heartbeats every 3 s, so a session death is noticed within seconds; a heartbeat may
        // retry for 9 s, which rides out an election (about 2 s here, longer on a loaded CI
        // machine running two clusters at once).
        session_ttl: Duration::from_secs(10),
        ..ClientConfig::default()
    }
}

async fn connect(cluster: &Cluster, endpoints: &[String]) -> LockClient {
    LockClient::connect_with(endpoints, config(cluster))
        .await
        .expect("connect to the cluster")
}

/// The leader's leader-confirmed view of `key`: `(token, waiter count)`, or `None` if unheld.
async fn key_state(cluster: &mut Cluster, key: &str) -> Result<Option<(u64, u32)>, String> {
    let leader = cluster.leader().await;
    cluster
        .client(leader)
        .inspect(key, true)
        .await
        .map(|info| info.map(|i| (i.fencing_token, i.waiter_count)))
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_finds_the_leader_from_followers_only() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let followers = cluster.followers().await;
    let endpoints: Vec<String> = followers.iter().map(|&id| cluster.endpoint(id)).collect();

    let client = connect(&cluster, &endpoints).await;
    let session = client.open_session("t40-discovery").await.expect("session");
    let handle = session
        .try_acquire("t40/discovery", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted: the key is free");
    assert_eq!(client.believed_leader(), cluster.addr(leader));
    assert!(
        client.endpoints().contains(&cluster.addr(leader)),
        "{:?}",
        client.endpoints()
    );
    assert_eq!(
        key_state(&mut cluster, "t40/discovery").await,
        Ok(Some((handle.fencing_token, 0)))
    );
    assert_eq!(session.release(&handle).await, Ok(true));
    assert_eq!(session.close().await, Ok(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_kept_alive_handle_survives_a_leader_failover() {
    let mut cluster = Cluster::start(3).await;
    let old_leader = cluster.leader().await;
    let client = connect(&cluster, &cluster.endpoints()).await;
    let session = client.open_session("t40-failover").await.expect("session");
    let lost: Arc<Mutex<Vec<LockHandle>>> = Arc::default();
    let sink = Arc::clone(&lost);
    session.on_lock_lost(move |h| sink.lock().expect("lost list").push(h.clone()));
    // A 9 s lease: keep-alive renews every 3 s and may retry for 8.1 s (the lease minus the
    // 10 % safety margin), so the failover (about 2 s) falls well inside one lease.
    let handle = session
        .acquire("t40/failover", Duration::from_secs(9), Duration::ZERO)
        .await
        .expect("acquire")
        .expect("granted");
    session.keep_alive(&handle).expect("keep alive");

    cluster.kill(old_leader);
    // A renewal issued the instant the leader died rides out the election inside the SDK:
    // it answers a renewed handle, not Contention and never "lost".
    let killed_at = Instant::now();
    let renewed = session
        .renew(&handle)
        .await
        .expect("a renewal across the failover succeeds within the call budget")
        .expect("the grant survives the failover");
    eprintln!(
        "t40: renewal across a leader failover took {} ms",
        killed_at.elapsed().as_millis()
    );
    assert_eq!(renewed.fencing_token, handle.fencing_token);
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, old_leader);
    assert_eq!(client.believed_leader(), cluster.addr(new_leader));

    // Past the first handle's deadline, and renewed at the new leader since.
    let latest = poll_until(
        "a renewal at the new leader, past the first deadline",
        REACTION_MAX,
        || {
            let latest = session.latest(&handle);
            async move {
                match latest {
                    Ok(h)
                        if Instant::now() > handle.client_deadline
                            && h.client_deadline > handle.client_deadline =>
                    {
                        Ok(h)
                    }
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .expect("the handle is still being renewed");
    assert_eq!(latest.fencing_token, handle.fencing_token);
    assert_eq!(session.check_still_held(&handle), Ok(()));
    assert_eq!(session.check_still_held_confirmed(&handle).await, Ok(()));
    assert!(session.is_alive());
    assert!(lost.lock().expect("lost list").is_empty());
    assert_eq!(
        key_state(&mut cluster, "t40/failover").await,
        Ok(Some((handle.fencing_token, 0)))
    );
    assert_eq!(session.release(&handle).await, Ok(true));
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_session_death_fires_the_listener() {
    let mut cluster = Cluster::start(3).await;
    let client = connect(&cluster, &cluster.endpoints()).await;
    let session = client.open_session("t40-death").await.expect("session");
    let lost: Arc<Mutex<Vec<LockHandle>>> = Arc::default();
    let sink = Arc::clone(&lost);
    session.on_lock_lost(move |h| sink.lock().expect("lost list").push(h.clone()));
    let handle = session
        .try_acquire("t40/death", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");

    // The session ends on the server behind the SDK's back (an operator, or a long pause of
    // this process would do the same); the next heartbeat learns it.
    let other = connect(&cluster, &cluster.endpoints()).await;
    assert_eq!(other.close_session(session.session_id()).await, Ok(1));

    let fired = poll_until("the lost-lock listener", REACTION_MAX, || {
        let seen = lost.lock().expect("lost list").clone();
        async move {
            match seen.as_slice() {
                [one] => Ok(one.clone()),
                other => Err(format!("{} calls", other.len())),
            }
        }
    })
    .await
    .expect("the listener fires");
    assert_eq!(fired.key, "t40/death");
    assert_eq!(fired.fencing_token, handle.fencing_token);
    assert!(!session.is_alive());
    assert_eq!(
        session.check_still_held(&handle),
        Err(LockError::LockLost {
            key: "t40/death".into()
        })
    );
    assert!(matches!(
        session.try_acquire("t40/death", LONG_TTL).await,
        Err(LockError::InvalidArgument { .. })
    ));
    assert_eq!(key_state(&mut cluster, "t40/death").await, Ok(None));
    assert_eq!(lost.lock().expect("lost list").len(), 1, "fired once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_dropped_acquire_leaves_no_waiter_and_no_grant() {
    let mut cluster = Cluster::start(3).await;
    let client = connect(&cluster, &cluster.endpoints()).await;
    let holder = client.open_session("t40-holder").await.expect("holder");
    let held = holder
        .try_acquire("t40/cancel", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");

    let waiter = Arc::new(client.open_session("t40-waiter").await.expect("waiter"));
    let waiting = {
        let waiter = Arc::clone(&waiter);
        tokio::spawn(async move {
            waiter
                .acquire("t40/cancel", LONG_TTL, Duration::from_secs(60))
                .await
        })
    };
    poll_until("the waiter to queue", REACTION_MAX, || {
        let client = client.clone();
        async move {
            match client.inspect("t40/cancel").await {
                Ok(Some(info)) if info.waiter_count == 1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await
    .expect("queued");

    // Dropping the acquire future (aborting its task) must withdraw the waiter.
    waiting.abort();
    assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
    poll_until("the waiter to leave the queue", REACTION_MAX, || {
        let client = client.clone();
        async move {
            match client.inspect("t40/cancel").await {
                Ok(Some(info)) if info.waiter_count == 0 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await
    .expect("no waiter left");

    // With no waiter left, the release frees the key instead of handing it over.
    assert_eq!(holder.release(&held).await, Ok(true));
    assert_eq!(key_state(&mut cluster, "t40/cancel").await, Ok(None));
    let waiter_id = waiter.session_id().to_owned();
    let leader = cluster.leader().await;
    assert_eq!(
        cluster.client(leader).locks_of(&waiter_id).await,
        Ok(vec![])
    );
    holder.close().await.expect("close holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_first_program_acquires_checks_and_releases() {
    let mut cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();

    let tls = tls(&cluster);
    let config = || ClientConfig {
        tls: tls.clone(),
        ..ClientConfig::default()
    };
    let token = first_program::first_program(&endpoints, config())
        .await
        .expect("the first program runs")
        .expect("granted: the key is free");
    // It released the key before closing its session.
    assert_eq!(key_state(&mut cluster, first_program::KEY).await, Ok(None));

    // While another owner holds the key, it waits its MAX_WAIT and answers "not mine" — not
    // an error — and leaves the other grant alone.
    let client = connect(&cluster, &cluster.endpoints()).await;
    let other = client.open_session("t40-other").await.expect("session");
    let held = other
        .try_acquire(first_program::KEY, LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted: the key is free");
    assert!(held.fencing_token > token);
    let started = Instant::now();
    assert_eq!(
        first_program::first_program(&endpoints, config()).await,
        Ok(None)
    );
    assert!(started.elapsed() >= first_program::MAX_WAIT);
    assert_eq!(
        key_state(&mut cluster, first_program::KEY).await,
        Ok(Some((held.fencing_token, 0)))
    );
    assert_eq!(other.release(&held).await, Ok(true));
    other.close().await.expect("close");
}

/// How long the SDK may take to report a TLS mismatch: one status attempt per endpoint
/// (`ClientConfig::attempt_timeout`, 2 s) plus scheduling noise. A mismatch is seen at the
/// handshake, so it never waits for the call budget (10 s).
const MISMATCH_REPORTED_WITHIN: Duration = Duration::from_secs(5);

/// `connect_with` fails with `Contention`, within [`MISMATCH_REPORTED_WITHIN`], and the message
/// contains every one of `words`.
async fn assert_connect_fails_naming(endpoints: &[String], config: ClientConfig, words: &[&str]) {
    let started = Instant::now();
    let answer = LockClient::connect_with(endpoints, config).await;
    let took = started.elapsed();
    match answer {
        Err(LockError::Contention { message }) => {
            for word in words {
                assert!(message.contains(word), "{message} should name {word}");
            }
        }
        Err(other) => panic!("expected Contention naming {words:?}, got {other:?}"),
        Ok(_) => panic!("expected a refusal naming {words:?}, but the client connected"),
    }
    assert!(took < MISMATCH_REPORTED_WITHIN, "the refusal took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_a_plaintext_sdk_at_a_tls_cluster_is_told_to_set_lockd_ca() {
    let cluster = Cluster::start(1).await;
    let addrs: Vec<String> = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.addr(id))
        .collect();
    assert_connect_fails_naming(&addrs, ClientConfig::default(), &["TLS", "LOCKD_CA"]).await;
    // An https:// endpoint without a CA is refused before anything is dialled.
    match LockClient::connect_with(&cluster.endpoints(), ClientConfig::default()).await {
        Err(LockError::InvalidArgument { message }) => {
            assert!(message.contains("LOCKD_CA"), "{message}")
        }
        other => panic!(
            "expected InvalidArgument naming LOCKD_CA, got {:?}",
            other.map(|_| ())
        ),
    }
    // With the CA and the client's certificate it works.
    let client = connect(&cluster, &addrs).await;
    assert_eq!(client.inspect("t40-tls").await, Ok(None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_a_ca_that_did_not_sign_the_nodes_fails_the_handshake_by_name() {
    let cluster = Cluster::start(1).await;
    let foreign = cluster.pki().foreign();
    let (cert, key) = foreign.identity("client");
    let config = ClientConfig {
        tls: Some(TlsConfig::new(foreign.ca()).with_identity(cert, key)),
        ..ClientConfig::default()
    };
    assert_connect_fails_naming(
        &cluster.endpoints(),
        config,
        &["TLS handshake failed", "LOCKD_CA"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t40_client_a_tls_sdk_at_a_plaintext_node_names_tls() {
    let insecure = Cluster::start_with(lock_tests::ClusterConfig::insecure(1)).await;
    // Certificates from a cluster that serves TLS, pointed at one that does not.
    let secure = Cluster::start(1).await;
    let addrs: Vec<String> = insecure
        .ids()
        .into_iter()
        .map(|id| insecure.addr(id))
        .collect();
    assert_connect_fails_naming(&addrs, config(&secure), &["TLS"]).await;
    // The plaintext client the insecure node expects works.
    let client = LockClient::connect_with(&addrs, ClientConfig::default())
        .await
        .expect("plaintext connect to an --insecure node");
    assert_eq!(client.inspect("t40-plain").await, Ok(None));
}
