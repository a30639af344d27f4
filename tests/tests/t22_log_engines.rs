//! The Raft log engines (`--log-engine wal|sled`): a cluster on either serves locks and keeps
//! them, with their fencing tokens, across a restart of every node.
//!
//! The engines' own crash and corruption tests live in `raft-store`; this file shows that the
//! node opens the engine it is asked for, on disk where it says, and that nothing above the
//! engine depends on which one it is.

use std::time::Duration;

use lock_tests::{Cluster, ClusterConfig};

/// Lease of grants and sessions that must not expire during a test.
const LONG_TTL: Duration = Duration::from_secs(60);

/// Sub-directory of a node's data dir holding its Raft storage (`lockd::identity`).
const STORAGE_SUBDIR: &str = "raft";

async fn grants_survive_a_full_restart(engine: &str, engine_dir: &str, other_dir: &str) {
    let mut cluster = Cluster::start_with(ClusterConfig {
        extra_args: vec!["--log-engine".into(), engine.into()],
        ..Default::default()
    })
    .await;
    let client = cluster.cluster_client();
    let session = client
        .open_session("engines", LONG_TTL)
        .await
        .expect("open session");
    let mut held = Vec::new();
    for key in ["engine/a", "engine/b", "engine/c"] {
        let grant = client
            .acquire(&session.id, key, LONG_TTL, Duration::ZERO)
            .await
            .expect("acquire")
            .unwrap_or_else(|| panic!("{key} is free"));
        held.push(grant);
    }
    for id in cluster.ids() {
        let storage = cluster.data_dir(id).join(STORAGE_SUBDIR);
        assert!(
            storage.join(engine_dir).is_dir(),
            "node {id} with --log-engine {engine} has no {}",
            storage.join(engine_dir).display()
        );
        assert!(
            !storage.join(other_dir).exists(),
            "node {id} with --log-engine {engine} also wrote {}",
            storage.join(other_dir).display()
        );
    }

    cluster.restart_all(Duration::from_secs(20)).await;

    let client = cluster.cluster_client();
    for grant in &held {
        let info = client
            .inspect_confirmed(&grant.key)
            .await
            .expect("inspect")
            .unwrap_or_else(|| panic!("{} lost its grant in the restart ({engine})", grant.key));
        assert_eq!(
            (info.session_id.as_str(), info.fencing_token),
            (session.id.as_str(), grant.fencing_token),
            "{} after the restart ({engine})",
            grant.key
        );
    }
    let last = held.iter().map(|g| g.fencing_token).max().unwrap_or(0);
    let fresh = client
        .acquire(&session.id, "engine/after", LONG_TTL, Duration::ZERO)
        .await
        .expect("acquire after restart")
        .expect("a free key");
    assert!(
        fresh.fencing_token > last,
        "token {} after the restart is not above {last} ({engine})",
        fresh.fencing_token
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_cluster_keeps_its_grants_and_tokens_across_a_full_restart() {
    grants_survive_a_full_restart("wal", "wal", "log").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_cluster_keeps_its_grants_and_tokens_across_a_full_restart() {
    grants_survive_a_full_restart("sled", "log", "wal").await;
}
