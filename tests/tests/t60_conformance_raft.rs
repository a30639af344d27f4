//! The conformance suite (issue 8) against the Raft store, one node and three nodes: real
//! `lockd` nodes started in-process with `lockd::server::run_with_store`, so the suite drives
//! the leader's `RaftBackend` through the `LockStore` SPI directly. Always runs.

mod conformance;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use conformance::{Backend, Cut, Cuttable, run_suite};
use lockd::backend::raft::RaftBackend;
use lockd::config::{Config, LogFormat};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// How long a cluster gets to elect a leader whose leases are ready.
const LEADER_WAIT: Duration = Duration::from_secs(30);

struct Node {
    store: RaftBackend,
    stop: Option<oneshot::Sender<()>>,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

struct InProcessCluster {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl InProcessCluster {
    async fn start(size: u64) -> InProcessCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut listeners = Vec::new();
        let mut peers = BTreeMap::new();
        for id in 1..=size {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            peers.insert(id, l.local_addr().expect("addr").to_string());
            listeners.push((id, l));
        }
        let mut nodes = Vec::new();
        for (id, listener) in listeners {
            let listen = listener.local_addr().expect("addr");
            // The node binds the port itself on its own runtime.
            drop(listener);
            let config = Config {
                node_id: id,
                listen,
                data_dir: dir.path().join(format!("node-{id}")),
                peers: peers.clone(),
                raft_dial: Default::default(),
                bootstrap: id == 1,
                cluster_name: "conformance".into(),
                roles: Default::default(),
                tokens_file: None,
                log_format: LogFormat::Human,
                heartbeat_interval_ms: lockd::config::HEARTBEAT_INTERVAL_MS_DEFAULT,
                election_timeout_min_ms: lockd::config::ELECTION_TIMEOUT_MIN_MS_DEFAULT,
                election_timeout_max_ms: lockd::config::ELECTION_TIMEOUT_MAX_MS_DEFAULT,
                safety_margin_ms: lockd::config::SAFETY_MARGIN_MS_DEFAULT,
                snapshot_logs_since_last: lockd::config::SNAPSHOT_LOGS_SINCE_LAST_DEFAULT,
                log_engine: Default::default(),
                worker_threads: None,
                test_clock_offset_ms: 0,
                test_snapshot_background_from: None,
                backend: lockd::config::Backend::Raft,
                pg_url: None,
                etcd_endpoints: Vec::new(),
                // In-process and plaintext, as `--insecure`: the SPI is what is under test.
                tls: None,
                metrics_listen: None,
            };
            config.validate().expect("valid config");
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let (store_tx, store_rx) = oneshot::channel();
            // `server::run*` is not `Send` (it is the body of `main`), so each node runs on a
            // thread of its own with its own runtime, like a process would.
            let thread = std::thread::Builder::new()
                .name(format!("lockd-node-{id}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .map_err(|e| format!("node runtime: {e}"))?;
                    runtime
                        .block_on(lockd::server::run_with_store(
                            config,
                            None,
                            async move {
                                let _ = stop_rx.await;
                            },
                            store_tx,
                        ))
                        .map_err(|e| format!("{e:#}"))
                })
                .expect("spawn node thread");
            let store = store_rx.await.expect("the node hands over its store");
            nodes.push(Node {
                store,
                stop: Some(stop_tx),
                thread,
            });
        }
        InProcessCluster { nodes, _dir: dir }
    }

    /// Polls until one node leads and serves every kind of call: it commits a session and
    /// answers that session's heartbeat, which only a leader whose promote applied does (before,
    /// it answers `Contention`, and a test's first leader-local call would meet that).
    async fn leader(&self) -> RaftBackend {
        use lock_api::SessionRegistry;
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            for node in &self.nodes {
                if node.store.leader_check().is_ok()
                    && let Ok(s) = node
                        .store
                        .open_session("leader-probe", conformance::SESSION_TTL_LONG)
                        .await
                {
                    let promoted = matches!(
                        node.store
                            .heartbeat(&s, conformance::SESSION_TTL_LONG)
                            .await,
                        Ok(true)
                    );
                    let _ = node.store.close_session(&s).await;
                    if promoted {
                        return node.store.clone();
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {LEADER_WAIT:?}"
            );
            tokio::time::sleep(conformance::POLL_INTERVAL).await;
        }
    }

    async fn stop(mut self) {
        for node in &mut self.nodes {
            if let Some(stop) = node.stop.take() {
                let _ = stop.send(());
            }
        }
        for node in self.nodes {
            tokio::task::spawn_blocking(move || node.thread.join())
                .await
                .expect("join task")
                .expect("node thread")
                .expect("node exits cleanly");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_raft_one_node() {
    let cluster = InProcessCluster::start(1).await;
    let leader = cluster.leader().await;
    let ran = run_suite(
        "raft-1",
        Backend {
            store: leader,
            background_reaper: true,
            cuttable: None,
        },
    )
    .await;
    assert!(ran >= 13);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_raft_three_nodes() {
    let mut cluster = InProcessCluster::start(3).await;
    let leader = cluster.leader().await;
    let leader_id = leader.node_id();
    // The cut: stop both followers, so the leader can no longer reach a quorum.
    let followers: Vec<oneshot::Sender<()>> = cluster
        .nodes
        .iter_mut()
        .filter(|n| n.store.node_id() != leader_id)
        .filter_map(|n| n.stop.take())
        .collect();
    let cut: Cut = Box::new(move || {
        Box::pin(async move {
            for stop in followers {
                let _ = stop.send(());
            }
        })
    });
    let ran = run_suite(
        "raft-3",
        Backend {
            store: leader.clone(),
            background_reaper: true,
            cuttable: Some(Cuttable {
                store: leader,
                cut,
                shared: true,
            }),
        },
    )
    .await;
    assert!(ran >= 14);
    cluster.stop().await;
}

/// Sessions belong to the principal that opened them, on the Raft backend, and stay so across
/// a leader failover (docs/SECURITY.md §3, D-session-principal): another principal presenting
/// the session — to the old leader or to the new one, through a proposal or a leader-local
/// heartbeat or renewal — is refused `PermissionDenied`, and the holder's lock is untouched.
/// The principals are handed to the backend directly (what the gRPC services take from the
/// authorization layer's `Caller`), since this build's nodes serve plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_stay_bound_to_their_principal_across_a_failover() {
    use lockd::backend::Backend as _;

    const TTL_MS: u64 = 30_000;
    let mut cluster = InProcessCluster::start(3).await;
    let leader = cluster.leader().await;
    let (alice, bob) = (Some("alice"), Some("bob"));
    let (a, _) = leader
        .open_session(alice, "worker", TTL_MS)
        .await
        .expect("alice's session");
    let (b, _) = leader
        .open_session(bob, "worker", TTL_MS)
        .await
        .expect("bob's session");
    let held = leader
        .try_acquire(alice, &a, 1, "payout/7", TTL_MS)
        .await
        .expect("acquire")
        .expect("granted");

    async fn every_hijack_is_refused(node: &RaftBackend, a: &str, b: &str, token: u64) {
        let bob = Some("bob");
        let refused = |result: Result<(), lock_api::LockError>, what: &str| match result {
            Err(lock_api::LockError::PermissionDenied {
                principal,
                required_role,
            }) if principal == "bob" && required_role == lock_api::SESSION_OWNER_ROLE => {}
            other => panic!("{what}: {other:?}"),
        };
        refused(node.keep_alive(bob, a).await.map(drop), "heartbeat");
        refused(node.locks_of(bob, a).await.map(drop), "locks_of");
        refused(
            node.renew(bob, a, 10, "payout/7", token, TTL_MS)
                .await
                .map(drop),
            "renew",
        );
        refused(
            node.renew(bob, b, 11, "payout/7", token, TTL_MS)
                .await
                .map(drop),
            "renew own",
        );
        refused(
            node.release(bob, a, 12, "payout/7", token).await.map(drop),
            "release",
        );
        refused(
            node.release(bob, b, 13, "payout/7", token).await.map(drop),
            "release own",
        );
        refused(
            node.try_acquire(bob, a, 14, "other", TTL_MS)
                .await
                .map(drop),
            "try_acquire",
        );
        refused(
            node.acquire(bob, a, 1, "payout/7", TTL_MS, 500)
                .await
                .map(drop),
            "acquire",
        );
        refused(
            node.cancel_acquire(bob, a, 1, "payout/7").await.map(drop),
            "cancel",
        );
        refused(node.close_session(bob, a).await.map(drop), "close");
        let batch = node
            .keep_alive_batch(bob, &[a.to_owned(), b.to_owned()])
            .await
            .expect("the batch is answered");
        refused(batch[0].clone().map(drop), "batch entry");
        assert!(matches!(batch[1], Ok(Some(_))), "bob's own: {:?}", batch[1]);
    }

    every_hijack_is_refused(&leader, &a, &b, held.token).await;

    // Fail over: stop the leader; a new one is elected from the two others.
    let old = leader.node_id();
    for node in &mut cluster.nodes {
        if node.store.node_id() == old
            && let Some(stop) = node.stop.take()
        {
            let _ = stop.send(());
        }
    }
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader.node_id(), old, "a new leader");
    every_hijack_is_refused(&new_leader, &a, &b, held.token).await;

    let state = new_leader
        .inspect("payout/7", true)
        .await
        .expect("inspect")
        .expect("still held");
    assert_eq!(
        (state.session_id.as_str(), state.token),
        (a.as_str(), held.token)
    );
    assert_eq!(
        new_leader.locks_of(alice, &a).await.expect("alice's locks"),
        ["payout/7".to_owned()].into()
    );
    assert!(
        new_leader
            .renew(alice, &a, 20, "payout/7", held.token, TTL_MS)
            .await
            .expect("alice renews")
            .is_some()
    );
    assert!(
        new_leader
            .keep_alive(alice, &a)
            .await
            .expect("heartbeat")
            .is_some()
    );
    cluster.stop().await;
}
