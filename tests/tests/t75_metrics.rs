//! The metrics endpoint against real node processes (issue 20): every scrape parsed with a
//! Prometheus text-format parser (`lock_tests::metrics`, on `prometheus-parse`).
//!
//! - a scripted workload moves the counters by exactly what it did, on every node alike, and
//!   the replicated gauges agree on all three nodes;
//! - a killed follower is unreachable on the leader with a growing lag, and reachable with a
//!   lag of about 0 once it is back;
//! - a leader change is counted by the nodes that see it;
//! - `/readyz` fails on a node cut off from the others and passes after the heal;
//! - the Grafana dashboard (`deploy/grafana/lockd.json`) is well formed and queries only
//!   metrics a node exports.
//!
//! Every wait is a condition polled within a generous bound; no test sleeps for a result.

use std::collections::BTreeSet;
use std::time::Duration;

use lock_proto::v1::pipeline_request::Call;
use lock_proto::v1::{PipelineRequest, TryAcquireRequest};
use lock_tests::metrics::{Scrape, http_get, readyz};
use lock_tests::pki::HARNESS_IDENTITY;
use lock_tests::{Cluster, ClusterConfig, NodeClient, next_request_id, poll_until};
use tokio_stream::StreamExt;

/// How long a condition on the metrics may take to hold: a scrape reflects what is applied at
/// once, but a follower applies a moment later and a leader notices a dead peer only after an
/// election timeout; ten seconds is a wide margin for a loaded two-core machine.
const CONDITION_WAIT: Duration = Duration::from_secs(20);

/// The session TTL of the session left to expire: the shortest allowed, so the reaper acts
/// within a couple of seconds.
const SHORT_TTL: Duration = lock_api::limits::TTL_MIN;

/// The TTL of every other lease in the workload: far longer than the test.
const LONG_TTL: Duration = Duration::from_secs(120);

/// Every family of issue 20 a Raft node must list (HELP and TYPE) in every scrape, by the
/// name of its HELP line (a counter's without `_total`).
const RAFT_NODE_FAMILIES: [&str; 27] = [
    "lockd_raft_term",
    "lockd_raft_is_leader",
    "lockd_raft_leader_changes",
    "lockd_raft_commit_index",
    "lockd_raft_applied_index",
    "lockd_raft_purged_index",
    "lockd_raft_peer_reachable",
    "lockd_raft_replication_lag_entries",
    "lockd_wal_fsync_duration_seconds",
    "lockd_wal_bytes",
    "lockd_snapshot_build_duration_seconds",
    "lockd_snapshot_bytes",
    "lockd_proposer_batch_commands",
    "lockd_sessions",
    "lockd_locks_held",
    "lockd_waiters",
    "lockd_grants",
    "lockd_handoffs",
    "lockd_releases",
    "lockd_lease_expirations",
    "lockd_revocations",
    "lockd_acquire_wait_duration_seconds",
    "lockd_grpc_requests",
    "lockd_grpc_request_duration_seconds",
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_open_fds",
];

/// The applied-state counters, which every node counts where it applies.
const APPLIED_COUNTERS: [(&str, &[(&str, &str)]); 6] = [
    ("lockd_grants_total", &[]),
    ("lockd_handoffs_total", &[]),
    ("lockd_releases_total", &[]),
    ("lockd_revocations_total", &[]),
    ("lockd_lease_expirations_total", &[("kind", "grant")]),
    ("lockd_lease_expirations_total", &[("kind", "session")]),
];

fn metrics_cluster() -> ClusterConfig {
    ClusterConfig {
        metrics: true,
        ..ClusterConfig::default()
    }
}

async fn scrape(cluster: &Cluster, id: u64) -> Scrape {
    match Scrape::fetch(&cluster.metrics_url(id)).await {
        Ok(scrape) => scrape,
        Err(e) => panic!("scrape of node {id}: {e}"),
    }
}

/// Polls node `id`'s scrape until `check` accepts it; the last observation on timeout.
async fn until_scrape<T>(
    cluster: &Cluster,
    id: u64,
    what: &str,
    check: impl Fn(&Scrape) -> Result<T, String>,
) -> T {
    let url = cluster.metrics_url(id);
    let check = &check;
    let result = poll_until(&format!("node {id}: {what}"), CONDITION_WAIT, || {
        let url = url.clone();
        async move { check(&Scrape::fetch(&url).await?) }
    })
    .await;
    match result {
        Ok(value) => value,
        Err(e) => panic!("{e}\n{}", cluster.log_tails()),
    }
}

/// The value of `name{labels}` in `s`, or an error naming it.
fn must(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
    s.value(name, labels)
        .ok_or_else(|| format!("no sample {name}{labels:?}"))
}

fn requests(s: &Scrape, method: &str, code: &str) -> f64 {
    s.value_or_zero(
        "lockd_grpc_requests_total",
        &[
            ("service", "lockd.v1.LockService"),
            ("method", method),
            ("code", code),
        ],
    )
}

#[tokio::test]
async fn every_family_is_listed_from_the_first_scrape_with_help_text() {
    let mut cluster = Cluster::start_with(metrics_cluster()).await;
    let leader = cluster.leader().await;
    for id in cluster.ids() {
        let s = scrape(&cluster, id).await;
        for family in RAFT_NODE_FAMILIES {
            let help = s.help(family).unwrap_or_else(|| {
                panic!("node {id}: family {family} has no HELP line:\n{}", s.text())
            });
            assert!(
                help.len() > 10,
                "node {id}: {family}'s HELP says little: {help:?}"
            );
            assert!(
                s.text().contains(&format!("# TYPE {family} ")),
                "node {id}: family {family} has no TYPE line"
            );
        }
        // Samples of the families that have one from the start.
        assert_eq!(
            must(&s, "lockd_raft_is_leader", &[]).unwrap(),
            f64::from(id == leader)
        );
        assert!(must(&s, "lockd_raft_term", &[]).unwrap() >= 1.0);
        assert!(must(&s, "process_resident_memory_bytes", &[]).unwrap() > 0.0);
        assert!(must(&s, "process_open_fds", &[]).unwrap() > 0.0);
        assert!(must(&s, "lockd_wal_bytes", &[]).unwrap() > 0.0);
        for (name, labels) in APPLIED_COUNTERS {
            assert_eq!(
                must(&s, name, labels).unwrap(),
                0.0,
                "node {id}: {name}{labels:?}"
            );
        }
    }
    let (status, body) = http_get(&cluster.metrics_url(leader), "/healthz")
        .await
        .unwrap();
    assert_eq!((status, body.trim()), (200, "ok"));
    let (status, _) = http_get(&cluster.metrics_url(leader), "/no-such-page")
        .await
        .unwrap();
    assert_eq!(status, 404);
}

/// One `Pipeline` stream carrying `n` `TryAcquire` calls on fresh keys, all answered.
async fn pipeline_try_acquires(node: &NodeClient, session_id: &str, n: u64) {
    let calls: Vec<PipelineRequest> = (0..n)
        .map(|i| PipelineRequest {
            call_id: i,
            timeout_ms: 10_000,
            call: Some(Call::TryAcquire(TryAcquireRequest {
                session_id: session_id.to_owned(),
                request_id: next_request_id(),
                key: format!("pipe/{i}"),
                ttl_ms: lock_tests::ms(LONG_TTL),
            })),
        })
        .collect();
    let mut answers = node
        .lock_service()
        .pipeline(tokio_stream::iter(calls))
        .await
        .expect("Pipeline opens")
        .into_inner();
    let mut answered = 0;
    while let Some(answer) = answers.next().await {
        answer.expect("no stream error");
        answered += 1;
    }
    assert_eq!(answered, n);
}

#[tokio::test]
async fn a_scripted_workload_moves_the_counters_by_exactly_what_it_did_on_every_node() {
    let mut cluster = Cluster::start_with(metrics_cluster()).await;
    let leader = cluster.leader().await;
    let at_leader = cluster.client(leader);
    let before = scrape(&cluster, leader).await;

    // 5 direct grants.
    let holder = at_leader.open_session("holder", LONG_TTL).await.unwrap();
    let mut grants = Vec::new();
    for i in 0..5 {
        let grant = at_leader
            .try_acquire(&holder.id, &format!("k/{i}"), LONG_TTL)
            .await
            .unwrap()
            .expect("a free key is granted");
        grants.push(grant);
    }
    // A waiter on k/0, handed the key when its holder releases it: a grant, a hand-off and a
    // release. Its blocking Acquire is the one observed wait.
    let waiter = at_leader.open_session("waiter", LONG_TTL).await.unwrap();
    let waiting = {
        let client = at_leader.clone();
        let session = waiter.id.clone();
        tokio::spawn(async move {
            client
                .acquire(&session, "k/0", LONG_TTL, Duration::from_secs(30))
                .await
        })
    };
    until_scrape(&cluster, leader, "one waiter queued", |s| {
        match must(s, "lockd_waiters", &[])? {
            1.0 => Ok(()),
            n => Err(format!("{n} waiters")),
        }
    })
    .await;
    assert!(
        at_leader
            .release(&holder.id, "k/0", grants[0].fencing_token)
            .await
            .unwrap()
    );
    let handed = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter is handed k/0");
    assert!(handed.fencing_token > grants[0].fencing_token);
    // A revoke of a held key counts; a revoke of a free key does not, and neither is a
    // release.
    at_leader
        .force_revoke("k/1", HARNESS_IDENTITY, "metrics test")
        .await
        .unwrap();
    at_leader
        .force_revoke("never-held", HARNESS_IDENTITY, "metrics test")
        .await
        .unwrap();
    // A session left to expire with a grant: one session expiry, the grant not counted as a
    // grant expiry.
    let doomed = at_leader.open_session("doomed", SHORT_TTL).await.unwrap();
    at_leader
        .try_acquire(&doomed.id, "k/doomed", LONG_TTL)
        .await
        .unwrap()
        .expect("granted");
    // A refused call: counted under its method with its status code.
    let refused = at_leader.try_acquire(&holder.id, "", LONG_TTL).await;
    assert!(refused.is_err(), "an empty key is refused: {refused:?}");
    // Two calls on one Pipeline stream: two TryAcquire calls and one Pipeline.
    pipeline_try_acquires(&at_leader, &holder.id, 2).await;

    until_scrape(
        &cluster,
        leader,
        "the doomed session to expire",
        |s| match must(s, "lockd_lease_expirations_total", &[("kind", "session")])? {
            1.0 => Ok(()),
            n => Err(format!("{n} session expirations")),
        },
    )
    .await;
    cluster.wait_caught_up(CONDITION_WAIT).await.unwrap();
    let after = scrape(&cluster, leader).await;
    let moved = |name: &str, labels: &[(&str, &str)]| {
        after.value_or_zero(name, labels) - before.value_or_zero(name, labels)
    };
    // 5 direct + 1 hand-off + 1 doomed + 2 on the pipeline.
    assert_eq!(moved("lockd_grants_total", &[]), 9.0);
    assert_eq!(moved("lockd_handoffs_total", &[]), 1.0);
    assert_eq!(moved("lockd_releases_total", &[]), 1.0);
    assert_eq!(moved("lockd_revocations_total", &[]), 1.0);
    assert_eq!(
        moved("lockd_lease_expirations_total", &[("kind", "session")]),
        1.0
    );
    assert_eq!(
        moved("lockd_lease_expirations_total", &[("kind", "grant")]),
        0.0
    );
    // The API families on the node that answered.
    assert_eq!(
        requests(&after, "TryAcquire", "OK") - requests(&before, "TryAcquire", "OK"),
        8.0
    );
    assert_eq!(requests(&after, "TryAcquire", "INVALID_ARGUMENT"), 1.0);
    assert_eq!(requests(&after, "Pipeline", "OK"), 1.0);
    assert_eq!(requests(&after, "Acquire", "OK"), 1.0);
    assert_eq!(requests(&after, "Release", "OK"), 1.0);
    assert_eq!(requests(&after, "ForceRevoke", "OK"), 2.0);
    assert_eq!(
        must(&after, "lockd_acquire_wait_duration_seconds_count", &[]).unwrap(),
        1.0,
        "one blocking Acquire, and TryAcquire is not observed"
    );
    assert_eq!(
        must(
            &after,
            "lockd_grpc_request_duration_seconds_count",
            &[
                ("service", "lockd.v1.LockService"),
                ("method", "TryAcquire")
            ]
        )
        .unwrap(),
        requests(&after, "TryAcquire", "OK") + requests(&after, "TryAcquire", "INVALID_ARGUMENT"),
    );
    assert!(must(&after, "lockd_proposer_batch_commands_count", &[]).unwrap() >= 1.0);
    assert!(must(&after, "lockd_wal_fsync_duration_seconds_count", &[]).unwrap() >= 1.0);

    // Every node counted the same, and holds the same replicated state: holder's k/2..k/4
    // and pipe/0..1, waiter's k/0; two sessions; no waiter.
    for id in cluster.ids() {
        let s = scrape(&cluster, id).await;
        for (name, labels) in APPLIED_COUNTERS {
            assert_eq!(
                s.value(name, labels),
                after.value(name, labels),
                "node {id} and leader {leader} disagree on {name}{labels:?}"
            );
        }
        assert_eq!(must(&s, "lockd_locks_held", &[]).unwrap(), 6.0, "node {id}");
        assert_eq!(must(&s, "lockd_sessions", &[]).unwrap(), 2.0, "node {id}");
        assert_eq!(must(&s, "lockd_waiters", &[]).unwrap(), 0.0, "node {id}");
    }
}

/// `lockd_raft_peer_reachable{peer}` and `lockd_raft_replication_lag_entries{peer}` on the
/// leader.
fn peer(s: &Scrape, id: u64) -> Result<(f64, f64), String> {
    let peer = id.to_string();
    Ok((
        must(s, "lockd_raft_peer_reachable", &[("peer", &peer)])?,
        must(s, "lockd_raft_replication_lag_entries", &[("peer", &peer)])?,
    ))
}

#[tokio::test]
async fn a_killed_follower_is_unreachable_and_lags_then_catches_up() {
    let mut cluster = Cluster::start_with(metrics_cluster()).await;
    let leader = cluster.leader().await;
    let follower = cluster.followers().await[0];
    until_scrape(&cluster, leader, "every peer reachable", |s| {
        for id in cluster.ids().into_iter().filter(|&id| id != leader) {
            match peer(s, id)? {
                (1.0, _) => {}
                other => return Err(format!("peer {id}: {other:?}")),
            }
        }
        Ok(())
    })
    .await;
    let followers_scrape = scrape(&cluster, follower).await;
    assert!(
        !followers_scrape.has_sample("lockd_raft_peer_reachable"),
        "only the leader exports peer samples"
    );

    cluster.kill(follower);
    until_scrape(
        &cluster,
        leader,
        "the killed follower unreachable",
        |s| match peer(s, follower)? {
            (0.0, _) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    // Writes the follower misses: its lag grows with them.
    let at_leader = cluster.client(leader);
    let session = at_leader.open_session("lagging", LONG_TTL).await.unwrap();
    let mut lags = Vec::new();
    for round in 0..2 {
        for i in 0..10 {
            at_leader
                .try_acquire(&session.id, &format!("lag/{round}/{i}"), LONG_TTL)
                .await
                .unwrap()
                .expect("granted");
        }
        let (reachable, lag) = peer(&scrape(&cluster, leader).await, follower).unwrap();
        assert_eq!(reachable, 0.0);
        lags.push(lag);
    }
    assert!(lags[0] >= 1.0, "the dead follower lags: {lags:?}");
    assert!(
        lags[1] > lags[0],
        "its lag grows with each write it misses: {lags:?}"
    );

    cluster.start_node(follower).await;
    until_scrape(&cluster, leader, "the follower back and caught up", |s| {
        match peer(s, follower)? {
            // "About 0": a heartbeat-sized window of entries may be in flight.
            (1.0, lag) if lag <= 2.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_leader_change_is_counted_by_the_nodes_that_see_it() {
    let mut cluster = Cluster::start_with(metrics_cluster()).await;
    let old = cluster.leader().await;
    let mut before = Vec::new();
    for id in cluster.ids() {
        let changes = must(
            &scrape(&cluster, id).await,
            "lockd_raft_leader_changes_total",
            &[],
        )
        .unwrap();
        assert!(changes >= 1.0, "node {id} has learned of its first leader");
        before.push((id, changes));
    }
    cluster.kill(old);
    let new = cluster.leader().await;
    assert_ne!(new, old);
    for (id, changes) in before.into_iter().filter(|(id, _)| *id != old) {
        until_scrape(&cluster, id, "the new leader counted", |s| {
            let now = must(s, "lockd_raft_leader_changes_total", &[])?;
            if now > changes {
                Ok(())
            } else {
                Err(format!("{now} leader changes, {changes} before the kill"))
            }
        })
        .await;
        let s = scrape(&cluster, id).await;
        assert_eq!(
            must(&s, "lockd_raft_is_leader", &[]).unwrap(),
            f64::from(id == new)
        );
    }
}

#[tokio::test]
async fn readyz_fails_on_a_node_cut_off_and_passes_after_the_heal() {
    let mut cluster = Cluster::start_with(ClusterConfig {
        proxied_links: true,
        ..metrics_cluster()
    })
    .await;
    let ready_all = |cluster: &Cluster| {
        let urls: Vec<(u64, String)> = cluster
            .ids()
            .into_iter()
            .map(|id| (id, cluster.metrics_url(id)))
            .collect();
        async move {
            for (id, url) in &urls {
                readyz(url).await.map_err(|e| format!("node {id}: {e}"))?;
            }
            Ok(())
        }
    };
    poll_until("every node ready", CONDITION_WAIT, || ready_all(&cluster))
        .await
        .unwrap();
    let follower = cluster.followers().await[0];
    let url = cluster.metrics_url(follower);
    cluster.isolate(follower);
    poll_until("the cut-off node not ready", CONDITION_WAIT, || {
        let url = url.clone();
        async move {
            match readyz(&url).await {
                Err(why) if why.starts_with("503") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await
    .unwrap();
    // Still alive: health is not readiness.
    assert_eq!(http_get(&url, "/healthz").await.unwrap().0, 200);
    cluster.heal();
    poll_until("every node ready after the heal", CONDITION_WAIT, || {
        ready_all(&cluster)
    })
    .await
    .unwrap();
}

/// The PromQL metric names an expression mentions: every `lockd_…` or `process_…` word.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            if word.starts_with("lockd_") || word.starts_with("process_") {
                names.insert(std::mem::take(&mut word));
            }
            word.clear();
        }
    }
    names
}

#[tokio::test]
async fn the_dashboard_is_well_formed_and_queries_only_metrics_a_node_exports() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/lockd.json");
    let text = std::fs::read_to_string(path).expect("the dashboard is checked in");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    for field in ["title", "uid", "schemaVersion", "panels", "templating"] {
        assert!(
            dashboard.get(field).is_some(),
            "the dashboard has no {field:?}"
        );
    }
    let panels = dashboard["panels"].as_array().expect("panels is a list");
    let mut ids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    let mut queried = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("a numeric id")),
            "id twice: {title}"
        );
        titles.insert(title.to_owned());
        assert!(panel["type"].is_string(), "{title}: no type");
        if panel["type"] == "row" {
            continue;
        }
        for key in ["h", "w", "x", "y"] {
            assert!(panel["gridPos"][key].is_u64(), "{title}: gridPos.{key}");
        }
        let targets = panel["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{title}: no expr"));
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: {expr} queries no lockd metric");
            queried.extend(names);
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    for wanted in [
        "Leader and term per node",
        "Commit and applied index",
        "Replication lag",
        "WAL fsync latency",
        "Grants, hand-offs, expirations and revocations",
        "Requests by method",
        "Request latency by method",
        "Sessions, locks held and waiters",
    ] {
        assert!(titles.contains(wanted), "no panel {wanted:?} in {titles:?}");
    }
    // Every queried metric is in a real scrape of a leader (which has peer samples), after a
    // grant so the labelled gRPC families have samples too.
    let mut cluster = Cluster::start_with(metrics_cluster()).await;
    let leader = cluster.leader().await;
    // Leader-following and retrying: a loaded leader may refuse a write for a moment
    // (openraft's leader lease, answered NotLeader with no leader named).
    let client = cluster.cluster_client();
    let session = client.open_session("dashboard", LONG_TTL).await.unwrap();
    client
        .try_acquire(&session.id, "k", LONG_TTL)
        .await
        .unwrap();
    let url = cluster.metrics_url(leader);
    let missing = poll_until("every dashboard metric in a scrape", CONDITION_WAIT, || {
        let url = url.clone();
        let queried = queried.clone();
        async move {
            let s = Scrape::fetch(&url).await?;
            // The parser files a histogram's buckets under the family's name.
            let missing: Vec<_> = queried
                .iter()
                .filter(|n| !s.has_sample(n.strip_suffix("_bucket").unwrap_or(n)))
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not in the scrape: {missing:?}"))
            }
        }
    })
    .await;
    missing.unwrap();
}

/// The families a stateless node must list, and some it must not (it has no Raft log and does
/// not apply the lock table itself).
const STATELESS_LISTED: [&str; 6] = [
    "lockd_grpc_requests",
    "lockd_grpc_request_duration_seconds",
    "lockd_acquire_wait_duration_seconds",
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_open_fds",
];
const STATELESS_ABSENT: [&str; 4] = [
    "lockd_raft_term",
    "lockd_wal_fsync_duration_seconds",
    "lockd_grants",
    "lockd_sessions",
];

#[tokio::test]
async fn a_stateless_node_serves_the_families_that_apply_to_it() {
    let pg_url = match std::env::var("LOCKD_TEST_PG_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "LOCKD_TEST_PG_URL is unset: run the tests with scripts/test, or \
             `eval \"$(scripts/test-services.sh start)\"` first"
        ),
    };
    let binary = lock_tests::lockd_binary().expect("the lockd binary");
    let ports = lock_tests::ports::free_ports(2).expect("free ports");
    let (listen, metrics) = (
        format!("127.0.0.1:{}", ports[0]),
        format!("127.0.0.1:{}", ports[1]),
    );
    let dir = tempfile::tempdir().expect("a log directory");
    let log = std::fs::File::create(dir.path().join("node.log")).expect("a log file");
    let mut node = tokio::process::Command::new(binary)
        .args([
            "run",
            "--backend",
            "pg",
            "--pg-url",
            &pg_url,
            "--node-id",
            "1",
        ])
        .args(["--listen", &listen, "--metrics-listen", &metrics])
        // Plaintext: this case is about which families a stateless node serves (TLS on a
        // stateless node is t70_tls's).
        .arg("--insecure")
        .env_remove("LOCKD_METRICS_LISTEN")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("lockd starts");
    let url = format!("http://{metrics}");
    let log_path = dir.path().join("node.log");
    let ready = poll_until("the stateless node ready", CONDITION_WAIT, || {
        let url = url.clone();
        async move { readyz(&url).await }
    })
    .await;
    if let Err(e) = ready {
        panic!(
            "{e}\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
    }
    let client = NodeClient::new(&format!("http://{listen}"));
    let session = client.open_session("stateless", LONG_TTL).await.unwrap();
    // The database outlives the test: a key of this run only, and released at the end.
    let key = format!("t75/{}/{}", std::process::id(), next_request_id());
    let grant = client
        .acquire(&session.id, &key, LONG_TTL, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("granted");
    let s = Scrape::fetch(&url).await.unwrap();
    for family in STATELESS_LISTED {
        assert!(
            s.help(family).is_some(),
            "{family} is not listed:\n{}",
            s.text()
        );
    }
    for family in STATELESS_ABSENT {
        assert!(s.help(family).is_none(), "a stateless node lists {family}");
    }
    assert_eq!(requests(&s, "Acquire", "OK"), 1.0);
    assert_eq!(
        must(&s, "lockd_acquire_wait_duration_seconds_count", &[]).unwrap(),
        1.0
    );
    client
        .release(&session.id, &key, grant.fencing_token)
        .await
        .unwrap();
    client.close_session(&session.id).await.unwrap();
    node.kill().await.expect("the node stops");
}
