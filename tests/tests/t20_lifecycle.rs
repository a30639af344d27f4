//! The life of grants and sessions: expiry of an unheartbeated session and of an unrenewed
//! grant (and the hand-off to the next waiter), closing a session, force-revoke and fencing,
//! FIFO order of waiters, a restart of the whole cluster, and a clean stop's last snapshot.

use std::time::{Duration, Instant};

use lock_tests::log_lines::{field, line_with};
use lock_tests::pki::HARNESS_IDENTITY;
use lock_tests::{
    Cluster, ClusterClient, ClusterConfig, FencedRegister, Grant, LockError, poll_until,
};
use tokio::task::JoinHandle;

/// Lease of grants and sessions that must not expire during a test.
const LONG_TTL: Duration = Duration::from_secs(60);

/// Short lease for the grant or session a test lets expire: the contract's minimum plus a
/// second, so the expiry is observable quickly but is well above the election timeout.
const SHORT_TTL: Duration = Duration::from_secs(2);

/// How long a waiter waits server-side: far above any expiry or hand-off in these tests.
const WAITER_MAX_WAIT: Duration = Duration::from_secs(20);

/// How much later than its lease an expiry may be noticed: the leader's reaper cadence plus a
/// commit and scheduling on two loaded cores.
const EXPIRY_SLACK: Duration = Duration::from_secs(5);

/// Spawns a blocking `Acquire` of `key` by `session_id` at `client`.
fn spawn_waiter(
    client: &ClusterClient,
    session_id: &str,
    key: &str,
) -> JoinHandle<(Result<Option<Grant>, LockError>, Instant)> {
    let client = client.clone();
    let session_id = session_id.to_owned();
    let key = key.to_owned();
    tokio::spawn(async move {
        let answer = client
            .acquire(&session_id, &key, LONG_TTL, WAITER_MAX_WAIT)
            .await;
        (answer, Instant::now())
    })
}

/// Waits until `key`'s queue at the leader holds `count` waiters.
async fn wait_for_waiters(client: &ClusterClient, key: &str, count: u32) {
    poll_until(
        &format!("{count} waiter(s) queued on {key:?}"),
        Duration::from_secs(10),
        || {
            let client = client.clone();
            let key = key.to_owned();
            async move {
                match client.inspect(&key, true).await {
                    Ok(Some(info)) if info.waiter_count == count => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .expect("the waiter is queued");
}

/// Awaits a spawned waiter with a bound, expecting a grant.
async fn granted(
    waiter: JoinHandle<(Result<Option<Grant>, LockError>, Instant)>,
    what: &str,
) -> (Grant, Instant) {
    let joined = tokio::time::timeout(WAITER_MAX_WAIT + Duration::from_secs(5), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: the waiter never answered"))
        .unwrap_or_else(|e| panic!("{what}: the waiter task failed: {e}"));
    match joined {
        (Ok(Some(grant)), at) => (grant, at),
        (other, _) => panic!("{what}: expected a grant, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unheartbeated_session_loses_its_locks_to_the_next_waiter() {
    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let doomed = any
        .open_session("doomed", SHORT_TTL)
        .await
        .expect("open doomed");
    let waiter = any
        .open_session("waiter", LONG_TTL)
        .await
        .expect("open waiter");
    let at = cluster.cluster_client();
    // The grant outlives the session: only the session's expiry can free the key.
    let held = at
        .try_acquire(&doomed.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let pending = spawn_waiter(&at, &waiter.id, "k");
    wait_for_waiters(&at, "k", 1).await;

    // The last heartbeat: the session's deadline is at most its TTL after it was sent.
    let last_heartbeat_sent = Instant::now();
    assert!(
        at.heartbeat(&doomed.id).await.expect("heartbeat"),
        "doomed is alive"
    );

    let (grant, granted_at) = granted(pending, "waiter of k").await;
    let after = granted_at - last_heartbeat_sent;
    // The TTL the server granted (it may round or clamp what was asked).
    let ttl = doomed.ttl;
    println!("session of TTL {ttl:?} expired; waiter granted {after:?} after the last heartbeat");
    assert!(
        after >= ttl,
        "the key was handed over {after:?} after the last heartbeat, before the TTL {ttl:?}"
    );
    assert!(after <= ttl + EXPIRY_SLACK, "expiry took {after:?}");
    assert_eq!(grant.session_id, waiter.id);
    assert!(grant.fencing_token > held.fencing_token);

    assert!(
        !at.heartbeat(&doomed.id).await.expect("heartbeat"),
        "an expired session is gone for good"
    );
    match at
        .renew(&doomed.id, "k", held.fencing_token, LONG_TTL)
        .await
    {
        Ok(None) | Err(LockError::LockLost { .. }) | Err(LockError::InvalidArgument { .. }) => {}
        other => panic!("renewing a grant of an expired session answered {other:?}"),
    }
    let info = at
        .inspect("k", true)
        .await
        .expect("inspect")
        .expect("held by the waiter");
    assert_eq!(info.session_id, waiter.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_grant_expires_and_the_next_waiter_gets_it() {
    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let holder = any
        .open_session("holder", LONG_TTL)
        .await
        .expect("open holder");
    let waiter = any
        .open_session("waiter", LONG_TTL)
        .await
        .expect("open waiter");
    let at = cluster.cluster_client();
    let sent = Instant::now();
    let held = at
        .try_acquire(&holder.id, "k", SHORT_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let pending = spawn_waiter(&at, &waiter.id, "k");
    wait_for_waiters(&at, "k", 1).await;

    let (grant, granted_at) = granted(pending, "waiter of k").await;
    let after = granted_at - sent;
    println!(
        "grant of TTL {SHORT_TTL:?} expired; waiter granted {after:?} after the acquire was sent"
    );
    assert!(
        after >= SHORT_TTL,
        "handed over after {after:?}, before the lease {SHORT_TTL:?}"
    );
    assert!(after <= SHORT_TTL + EXPIRY_SLACK, "expiry took {after:?}");
    assert!(grant.fencing_token > held.fencing_token);

    // The holder's session lives on; only the grant is gone, and renewing it says "lost".
    assert!(at.heartbeat(&holder.id).await.expect("heartbeat"));
    assert!(at.locks_of(&holder.id).await.expect("locks_of").is_empty());
    let renewed = at
        .renew(&holder.id, "k", held.fencing_token, LONG_TTL)
        .await
        .expect("renew answers");
    assert_eq!(renewed, None, "a lapsed grant must never be revived");
    assert!(
        !at.release(&holder.id, "k", held.fencing_token)
            .await
            .expect("release")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_releases_everything_it_held() {
    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let closing = any.open_session("closing", LONG_TTL).await.expect("open");
    let waiter = any.open_session("waiter", LONG_TTL).await.expect("open");
    let at = cluster.cluster_client();
    let mut tokens = Vec::new();
    for key in ["a", "b", "c"] {
        let grant = at
            .try_acquire(&closing.id, key, LONG_TTL)
            .await
            .expect("try_acquire")
            .expect("granted");
        tokens.push(grant.fencing_token);
    }
    assert_eq!(
        at.locks_of(&closing.id).await.expect("locks_of"),
        vec!["a", "b", "c"]
    );
    let pending = spawn_waiter(&at, &waiter.id, "b");
    wait_for_waiters(&at, "b", 1).await;

    assert_eq!(
        at.close_session(&closing.id).await.expect("close"),
        3,
        "locks released"
    );
    let (grant, _) = granted(pending, "waiter of b").await;
    assert_eq!(grant.session_id, waiter.id);
    assert!(tokens.iter().all(|&t| grant.fencing_token > t));
    for key in ["a", "c"] {
        assert_eq!(
            at.inspect(key, true).await.expect("inspect"),
            None,
            "{key} is free"
        );
    }
    assert!(
        !at.heartbeat(&closing.id).await.expect("heartbeat"),
        "a closed session is gone"
    );
    assert_eq!(at.close_session(&closing.id).await.expect("close again"), 0);
    assert_eq!(at.locks_of(&waiter.id).await.expect("locks_of"), vec!["b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_revoke_fences_out_the_displaced_holder() {
    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let displaced = any.open_session("displaced", LONG_TTL).await.expect("open");
    let next = any.open_session("next", LONG_TTL).await.expect("open");
    let at = cluster.cluster_client();
    let register = FencedRegister::new("k");

    let old = at
        .try_acquire(&displaced.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    register
        .write(old.fencing_token, "by displaced")
        .expect("the first holder writes");
    let pending = spawn_waiter(&at, &next.id, "k");
    wait_for_waiters(&at, "k", 1).await;

    let outcome = at
        .force_revoke("k", HARNESS_IDENTITY, "stuck holder, ticket OPS-1")
        .await
        .expect("force_revoke");
    println!("force_revoke outcome: {outcome:?}");
    assert_eq!(outcome.key, "k");
    assert!(outcome.revoked);
    assert_eq!(outcome.previous_owner_id, "displaced");
    assert_eq!(outcome.previous_token, old.fencing_token);
    assert!(
        outcome.new_token_floor > old.fencing_token,
        "floor {} not above {}",
        outcome.new_token_floor,
        old.fencing_token
    );
    // The API has no read-back of the audit record's operator and reason (LockOutcome does not
    // carry them). The leader's log is the audit trail an operator sees: it must name both.
    let log_paths: Vec<_> = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.log_path(id))
        .collect();
    poll_until(
        "a node's log to record the revoke's operator and reason",
        Duration::from_secs(5),
        || {
            let log_paths = log_paths.clone();
            async move {
                for path in &log_paths {
                    let log = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
                    if log
                        .lines()
                        .any(|l| l.contains(HARNESS_IDENTITY) && l.contains("OPS-1"))
                    {
                        return Ok(());
                    }
                }
                Err(format!(
                    "no line in {log_paths:?} names the operator and the reason"
                ))
            }
        },
    )
    .await
    .expect("the revoke is audited in the log");

    let (new, _) = granted(pending, "waiter of k").await;
    assert_eq!(new.session_id, next.id);
    assert!(
        new.fencing_token > outcome.new_token_floor,
        "grant after the revoke has token {} <= floor {}",
        new.fencing_token,
        outcome.new_token_floor
    );
    register
        .write(new.fencing_token, "by next")
        .expect("the new holder writes");

    // The displaced holder learns it lost the grant, and its late write is fenced out.
    let renewed = at
        .renew(&displaced.id, "k", old.fencing_token, LONG_TTL)
        .await
        .expect("renew answers");
    assert_eq!(
        renewed, None,
        "the displaced holder's renew must answer lost"
    );
    assert_eq!(
        register.write(old.fencing_token, "late write by displaced"),
        Err(LockError::FencedOut {
            key: "k".into(),
            presented: old.fencing_token,
            stored: new.fencing_token
        })
    );
    assert!(
        !at.release(&displaced.id, "k", old.fencing_token)
            .await
            .expect("release")
    );
    let info = at.inspect("k", true).await.expect("inspect").expect("held");
    assert_eq!(
        (info.session_id.as_str(), info.fencing_token),
        (next.id.as_str(), new.fencing_token)
    );
    assert_eq!(register.value().as_deref(), Some("by next"));

    // Revoking an unheld key revokes nothing and still never lowers the floor.
    assert!(
        at.release(&next.id, "k", new.fencing_token)
            .await
            .expect("release")
    );
    let empty = at
        .force_revoke("k", HARNESS_IDENTITY, "cleanup")
        .await
        .expect("force_revoke");
    assert!(!empty.revoked);
    assert_eq!(
        (empty.previous_owner_id.as_str(), empty.previous_token),
        ("", 0)
    );
    assert!(empty.new_token_floor >= new.fencing_token);
    let after = at
        .try_acquire(&next.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    assert!(after.fencing_token > empty.new_token_floor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_arrival_order() {
    const WAITERS: usize = 5;
    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let holder = any.open_session("holder", LONG_TTL).await.expect("open");
    let at = cluster.cluster_client();
    let first = at
        .try_acquire(&holder.id, "fifo", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");

    let mut sessions = Vec::new();
    let mut pending = Vec::new();
    for i in 0..WAITERS {
        let session = any
            .open_session(&format!("waiter-{i}"), LONG_TTL)
            .await
            .expect("open");
        pending.push(spawn_waiter(&at, &session.id, "fifo"));
        // Known arrival order: the next waiter starts only once this one is queued.
        wait_for_waiters(&at, "fifo", u32::try_from(i + 1).expect("small")).await;
        sessions.push(session);
    }

    let mut current = first;
    let mut current_session = holder.id.clone();
    let mut pending = pending.into_iter();
    for (i, session) in sessions.iter().enumerate() {
        assert!(
            at.release(&current_session, "fifo", current.fencing_token)
                .await
                .expect("release"),
            "release by the holder before waiter-{i}"
        );
        let waiter = pending.next().expect("one task per waiter");
        let (grant, _) = granted(waiter, &format!("waiter-{i}")).await;
        assert_eq!(
            (grant.owner_id.as_str(), grant.session_id.as_str()),
            (format!("waiter-{i}").as_str(), session.id.as_str()),
            "the key went to the wrong waiter"
        );
        assert!(grant.fencing_token > current.fencing_token);
        let remaining = u32::try_from(WAITERS - i - 1).expect("small");
        let info = at
            .inspect("fifo", true)
            .await
            .expect("inspect")
            .expect("held");
        assert_eq!(
            info.waiter_count, remaining,
            "queue after granting waiter-{i}"
        );
        current = grant;
        current_session = session.id.clone();
    }
}

/// A cluster whose nodes decode their own snapshots behind their start however small they are
/// (`--test-snapshot-background-from 0`; a node does so from 16 MiB), or as they open.
async fn cluster_loading(background: bool) -> Cluster {
    let mut config = ClusterConfig::with_nodes(3);
    if background {
        config.extra_args = vec!["--test-snapshot-background-from".into(), "0".into()];
    }
    Cluster::start_with(config).await
}

/// What a node logs once its own snapshot, decoded behind its start, is in.
const LOADED_IN_THE_BACKGROUND: &str =
    "state loaded from the node's own snapshot in the background";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_restart_keeps_grants_sessions_and_the_token_counter() {
    full_restart_keeps_grants_sessions_and_the_token_counter(false).await;
}

/// The same with every node's own snapshot decoded behind its start: the nodes answer Raft,
/// elect and replay their logs before their tables are in, and serve the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_restart_with_snapshots_loading_behind_the_start_keeps_everything() {
    full_restart_keeps_grants_sessions_and_the_token_counter(true).await;
}

async fn full_restart_keeps_grants_sessions_and_the_token_counter(background: bool) {
    let mut cluster = cluster_loading(background).await;
    let any = cluster.cluster_client();
    let s1 = any.open_session("s1", LONG_TTL).await.expect("open");
    let s2 = any.open_session("s2", LONG_TTL).await.expect("open");
    let mut grants = Vec::new();
    for (session, key) in [(&s1, "a"), (&s1, "b"), (&s2, "c"), (&s2, "revoked")] {
        let grant = any
            .try_acquire(&session.id, key, LONG_TTL)
            .await
            .expect("try_acquire")
            .expect("granted");
        grants.push(grant);
    }
    let outcome = any
        .force_revoke("revoked", HARNESS_IDENTITY, "advance the floor")
        .await
        .expect("revoke");
    let highest = grants
        .iter()
        .map(|g| g.fencing_token)
        .max()
        .expect("grants")
        .max(outcome.new_token_floor);
    let grants: Vec<Grant> = grants.into_iter().filter(|g| g.key != "revoked").collect();

    let cluster_id = cluster.status(1).await.expect("status").cluster_id;
    let logs_at: Vec<(u64, u64)> = cluster
        .ids()
        .into_iter()
        .map(|id| (id, cluster.log_len(id)))
        .collect();
    let restarted = Instant::now();
    let leader = cluster.restart_all(Duration::from_secs(20)).await;
    println!(
        "restarted all nodes; leader {leader} after {:?}",
        restarted.elapsed()
    );
    if background {
        // The followers built a snapshot as they stopped, and loaded it behind their start.
        let loaded = logs_at
            .iter()
            .filter(|(id, at)| {
                cluster
                    .log_since(*id, *at)
                    .contains(LOADED_IN_THE_BACKGROUND)
            })
            .count();
        assert!(
            loaded >= 1,
            "no node loaded its own snapshot in the background"
        );
    }

    for grant in &grants {
        let info = any
            .inspect_confirmed(&grant.key)
            .await
            .expect("inspect")
            .unwrap_or_else(|| panic!("{} lost its grant in the restart", grant.key));
        assert_eq!(
            (
                info.session_id.as_str(),
                info.owner_id.as_str(),
                info.fencing_token
            ),
            (
                grant.session_id.as_str(),
                grant.owner_id.as_str(),
                grant.fencing_token
            ),
            "grant of {} after the restart",
            grant.key
        );
    }
    for id in cluster.ids() {
        // Node 1 restarts with --bootstrap: it must not initialise a second cluster.
        let status = cluster.status(id).await.expect("status");
        assert_eq!(
            status.cluster_id, cluster_id,
            "node {id}'s cluster id after the restart"
        );
        assert_eq!(
            status.members.len(),
            3,
            "node {id}'s membership after the restart"
        );
    }
    assert_eq!(
        any.inspect_confirmed("revoked").await.expect("inspect"),
        None
    );
    assert_eq!(
        any.locks_of(&s1.id).await.expect("locks_of"),
        vec!["a", "b"]
    );
    assert_eq!(any.locks_of(&s2.id).await.expect("locks_of"), vec!["c"]);
    assert!(
        any.heartbeat(&s1.id).await.expect("heartbeat"),
        "s1 survived the restart"
    );
    let renewed = any
        .renew(&s1.id, "a", grants[0].fencing_token, LONG_TTL)
        .await
        .expect("renew")
        .expect("a is still s1's");
    assert_eq!(renewed.fencing_token, grants[0].fencing_token);

    let fresh = any
        .try_acquire(&s2.id, "fresh", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    assert!(
        fresh.fencing_token > highest,
        "token {} reused or below the pre-restart high water {highest}",
        fresh.fencing_token
    );
}

/// The `index=N` field of the first line of `log` that contains `message`, with the line.
fn logged_index(log: &str, message: &str) -> Option<(u64, String)> {
    let line = line_with(log, &[message])?;
    let index = field(line, "index")?.parse().ok()?;
    Some((index, line.to_owned()))
}

/// A follower stopped cleanly builds a snapshot of everything it applied before it exits, and
/// its next start loads that snapshot and answers from it; the leader, stopped, builds none
/// (its followers' election must not wait for it) and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stopped_cleanly_restarts_from_a_snapshot_of_all_it_applied() {
    follower_stopped_cleanly_restarts_from_a_snapshot_of_all_it_applied(false).await;
}

/// The same with the follower's own snapshot decoded behind its start: once it is in, the
/// node answers from it as it would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_restarts_from_a_snapshot_loaded_behind_its_start() {
    follower_stopped_cleanly_restarts_from_a_snapshot_of_all_it_applied(true).await;
}

async fn follower_stopped_cleanly_restarts_from_a_snapshot_of_all_it_applied(background: bool) {
    let mut cluster = cluster_loading(background).await;
    let any = cluster.cluster_client();
    let session = any.open_session("stopper", LONG_TTL).await.expect("open");
    let mut grants = Vec::new();
    for i in 0..20 {
        let grant = any
            .try_acquire(&session.id, &format!("k{i}"), LONG_TTL)
            .await
            .expect("try_acquire")
            .expect("granted");
        grants.push(grant);
    }
    cluster
        .wait_caught_up(Duration::from_secs(20))
        .await
        .expect("every node applied the grants");
    let leader = cluster.leader().await;
    let follower = cluster.followers().await[0];
    let applied = cluster
        .status(follower)
        .await
        .expect("status")
        .applied_index;

    let follower_log_at = cluster.log_len(follower);
    let status = cluster.stop(follower).await;
    assert!(status.success(), "node {follower} exited with {status}");
    let log = cluster.log_since(follower, follower_log_at);
    let (built, line) = logged_index(&log, "snapshot built before stopping")
        .unwrap_or_else(|| panic!("node {follower} built no snapshot at stop:\n{log}"));
    assert!(
        built >= applied,
        "the snapshot at stop ({line}) is short of the applied index {applied}"
    );

    let restarted_at = cluster.log_len(follower);
    cluster.start_node(follower).await;
    let restarted = cluster.client(follower);
    // A node serves follower reads only once its table is in (before, it sends the caller to
    // the leader): the first answer from it is the table's.
    let first = &grants[0];
    poll_until(
        "the restarted node serves a read",
        Duration::from_secs(20),
        || async {
            match restarted.inspect(&first.key, false).await {
                Ok(Some(_)) => Ok(()),
                other => Err(format!("{}: {other:?}", first.key)),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("node {follower}: {e}"));
    let log = cluster.log_since(follower, restarted_at);
    let (loaded, line) = logged_index(&log, "state loaded from the node's own snapshot")
        .unwrap_or_else(|| panic!("node {follower} did not start from a snapshot:\n{log}"));
    assert_eq!(loaded, built, "{line}");
    assert_eq!(line.contains("in the background"), background, "{line}");
    for grant in &grants {
        let info = restarted
            .inspect(&grant.key, false)
            .await
            .expect("inspect")
            .unwrap_or_else(|| panic!("{} unheld on the restarted node", grant.key));
        assert_eq!(
            (info.session_id.as_str(), info.fencing_token),
            (grant.session_id.as_str(), grant.fencing_token),
            "{} on the restarted node",
            grant.key
        );
    }

    let leader_log_at = cluster.log_len(leader);
    let status = cluster.stop(leader).await;
    assert!(status.success(), "leader {leader} exited with {status}");
    let stopped = cluster.log_since(leader, leader_log_at);
    assert!(
        stopped.contains("no snapshot at stop: this node leads"),
        "leader {leader}'s stop:\n{stopped}"
    );
    assert!(
        !stopped.contains("building a snapshot before stopping"),
        "leader {leader}'s stop:\n{stopped}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_gets_the_remembered_answer() {
    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let session = any.open_session("retrier", LONG_TTL).await.expect("open");
    let other = any.open_session("other", LONG_TTL).await.expect("open");
    let at = cluster.cluster_client();

    // A retried acquire (same request id) answers the same grant; it never grants twice.
    let acquire_id = lock_tests::next_request_id();
    let first = at
        .try_acquire_with_request_id(&session.id, acquire_id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let again = at
        .try_acquire_with_request_id(&session.id, acquire_id, "k", LONG_TTL)
        .await
        .expect("the retry answers")
        .expect("the retry answers the grant it made");
    assert_eq!(
        again.fencing_token, first.fencing_token,
        "a retry must not make a second grant"
    );
    let next = at
        .try_acquire(&other.id, "probe", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    assert_eq!(
        next.fencing_token,
        first.fencing_token + 1,
        "the retry consumed a token (tokens are one global counter)"
    );

    // A retried release answers what the first one did.
    let release_id = lock_tests::next_request_id();
    let released = at
        .release_with_request_id(&session.id, release_id, "k", first.fencing_token)
        .await
        .expect("release");
    assert!(released);
    let released_again = at
        .release_with_request_id(&session.id, release_id, "k", first.fencing_token)
        .await
        .expect("the retry answers");
    assert!(
        released_again,
        "the retried release must answer the remembered `true`"
    );
    assert_eq!(at.inspect("k", true).await.expect("inspect"), None);
    // A new request (new id) for the same grant is a new question: it is gone now.
    assert!(
        !at.release(&session.id, "k", first.fencing_token)
            .await
            .expect("release")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_no_waiter_and_no_grant() {
    let cluster = Cluster::start(3).await;
    let any = cluster.cluster_client();
    let holder = any.open_session("holder", LONG_TTL).await.expect("open");
    let waiter = any.open_session("waiter", LONG_TTL).await.expect("open");
    let at = cluster.cluster_client();
    let held = at
        .try_acquire(&holder.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");

    let request_id = lock_tests::next_request_id();
    let pending = {
        let at = at.clone();
        let session_id = waiter.id.clone();
        tokio::spawn(async move {
            let sent = Instant::now();
            let answer = at
                .acquire_with_request_id(&session_id, request_id, "k", LONG_TTL, WAITER_MAX_WAIT)
                .await;
            (answer, sent.elapsed())
        })
    };
    wait_for_waiters(&at, "k", 1).await;
    assert!(
        !at.cancel_acquire(&waiter.id, request_id, "k")
            .await
            .expect("cancel"),
        "the wait had not been granted, so nothing was released"
    );
    let (answer, waited) = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the cancelled acquire answers")
        .expect("the task did not panic");
    assert_eq!(answer, Ok(None), "a cancelled wait answers 'not granted'");
    assert!(
        waited < WAITER_MAX_WAIT,
        "the cancelled wait lasted its whole max_wait"
    );
    let info = at.inspect("k", true).await.expect("inspect").expect("held");
    assert_eq!(info.waiter_count, 0, "the cancelled waiter is still queued");
    assert!(
        at.release(&holder.id, "k", held.fencing_token)
            .await
            .expect("release")
    );
    assert_eq!(
        at.inspect("k", true).await.expect("inspect"),
        None,
        "a released key went to a cancelled waiter"
    );

    // Cancelling an acquire that was already granted releases the grant.
    let granted_id = lock_tests::next_request_id();
    let grant = at
        .acquire_with_request_id(&waiter.id, granted_id, "k", LONG_TTL, WAITER_MAX_WAIT)
        .await
        .expect("acquire")
        .expect("a free key is granted");
    assert!(
        at.cancel_acquire(&waiter.id, granted_id, "k")
            .await
            .expect("cancel"),
        "cancelling a granted acquire releases its grant"
    );
    assert_eq!(at.inspect("k", true).await.expect("inspect"), None);
    assert!(
        !at.release(&waiter.id, "k", grant.fencing_token)
            .await
            .expect("release")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_times_out_leaves_no_waiter_behind() {
    let cluster = Cluster::start(3).await;
    let at = cluster.cluster_client();
    let holder = at.open_session("holder", LONG_TTL).await.expect("open");
    let waiter = at.open_session("waiter", LONG_TTL).await.expect("open");
    let held = at
        .try_acquire(&holder.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let max_wait = Duration::from_millis(700);
    let started = Instant::now();
    let answer = at
        .acquire(&waiter.id, "k", LONG_TTL, max_wait)
        .await
        .expect("acquire");
    let waited = started.elapsed();
    assert_eq!(answer, None, "a held key is not granted");
    assert!(
        waited >= max_wait,
        "gave up after {waited:?}, before {max_wait:?}"
    );
    assert!(
        waited <= max_wait + Duration::from_secs(3),
        "gave up only after {waited:?}"
    );
    let info = at.inspect("k", true).await.expect("inspect").expect("held");
    assert_eq!(info.waiter_count, 0, "the timed-out waiter is still queued");
    assert!(
        at.release(&holder.id, "k", held.fencing_token)
            .await
            .expect("release")
    );
    assert_eq!(
        at.inspect("k", true).await.expect("inspect"),
        None,
        "the key went to a waiter that had already been told 'not granted'"
    );
    assert!(at.locks_of(&waiter.id).await.expect("locks_of").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_sets_the_new_lease_length() {
    let cluster = Cluster::start(3).await;
    let at = cluster.cluster_client();
    let session = at.open_session("renewer", LONG_TTL).await.expect("open");
    let grant = at
        .try_acquire(&session.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let sent = Instant::now();
    let renewed = at
        .renew(&session.id, "k", grant.fencing_token, SHORT_TTL)
        .await
        .expect("renew")
        .expect("held");
    assert_eq!(renewed.fencing_token, grant.fencing_token);
    assert_eq!(renewed.ttl_ms, lock_tests::ms(SHORT_TTL));
    let freed_after = poll_until(
        "the shortened lease to lapse",
        SHORT_TTL + EXPIRY_SLACK,
        || {
            let at = at.clone();
            async move {
                match at.inspect("k", true).await {
                    Ok(None) => Ok(sent.elapsed()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .expect("a renewal to a shorter TTL shortens the lease");
    println!("lease renewed to {SHORT_TTL:?} lapsed {freed_after:?} after the renewal was sent");
    assert!(freed_after >= SHORT_TTL, "lapsed after {freed_after:?}");
    assert_eq!(
        at.renew(&session.id, "k", grant.fencing_token, LONG_TTL)
            .await
            .expect("renew"),
        None,
        "a lapsed grant must never be revived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_sent_late_in_the_lease_is_never_lost() {
    /// The lease of the grant and the session: short, so rounds are quick.
    const LEASE: Duration = Duration::from_millis(1500);
    /// Each renewal is sent this far into the lease since the last successful send: later
    /// than any SDK would, to probe the boundary (the server's deadline is at least the
    /// client's, since the server starts its clock after the client sent).
    const RENEW_AT: Duration = Duration::from_millis(1250);
    const ROUNDS: usize = 6;
    let cluster = Cluster::start(3).await;
    let at = cluster.cluster_client();
    let session = at.open_session("late", LEASE).await.expect("open");
    let mut sent = Instant::now();
    let grant = at
        .try_acquire(&session.id, "k", LEASE)
        .await
        .expect("try_acquire")
        .expect("granted");
    for round in 0..ROUNDS {
        tokio::time::sleep_until((sent + RENEW_AT).into()).await;
        let deadline = sent + LEASE;
        let send = Instant::now();
        // Both leases are renewed at once, so both requests leave at `send`.
        let (alive, renewed) = tokio::join!(
            at.heartbeat(&session.id),
            at.renew(&session.id, "k", grant.fencing_token, LEASE)
        );
        if !alive.expect("heartbeat") {
            // As for the renewal below: "gone" before the client deadline is a bug; after it
            // (a loaded machine woke this task late or retried) it is a correct answer.
            assert!(
                Instant::now() >= deadline,
                "round {round}: heartbeat sent {:?} before the client deadline answered the \
                 session gone before that deadline",
                deadline.saturating_duration_since(send)
            );
            println!("round {round}: heartbeat answered only after the client deadline; stopping");
            return;
        }
        match renewed.expect("renew") {
            Some(r) => assert_eq!(r.fencing_token, grant.fencing_token),
            None if Instant::now() < deadline => panic!(
                "round {round}: renewal sent {:?} before the client deadline answered lost \
                 before that deadline",
                deadline.saturating_duration_since(send)
            ),
            None => {
                // The answer came after the deadline (retries on a loaded machine): by then
                // "lost" is a correct answer, and nothing more can be concluded.
                println!("round {round}: answered only after the client deadline; stopping");
                return;
            }
        }
        sent = send;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_force_revoke_revokes_at_most_once() {
    let cluster = Cluster::start(3).await;
    let at = cluster.cluster_client();
    let displaced = at.open_session("displaced", LONG_TTL).await.expect("open");
    let next = at.open_session("next", LONG_TTL).await.expect("open");
    let old = at
        .try_acquire(&displaced.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let pending = spawn_waiter(&at, &next.id, "k");
    wait_for_waiters(&at, "k", 1).await;

    // lock.proto: "a retry carries the same value, so a lost answer followed by a retry
    // revokes at most once". The first answer is treated as lost; the retry must answer the
    // same outcome and must not revoke the grant the waiter received in between.
    let request_id = lock_tests::next_request_id();
    let first = at
        .force_revoke_with_request_id("k", HARNESS_IDENTITY, "stuck", request_id)
        .await
        .expect("force_revoke");
    assert_eq!(first.previous_token, old.fencing_token);
    let (new, _) = granted(pending, "waiter of k").await;
    let retry = at
        .force_revoke_with_request_id("k", HARNESS_IDENTITY, "stuck", request_id)
        .await
        .expect("the retried force_revoke answers");
    let info = at.inspect("k", true).await.expect("inspect");
    assert_eq!(
        info.as_ref().map(|i| i.fencing_token),
        Some(new.fencing_token),
        "the retried revoke (same request id {request_id}) revoked the next holder: \
         first outcome {first:?}, retry outcome {retry:?}"
    );
    assert_eq!(retry, first, "a retry must answer the remembered outcome");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_session_expires_is_dropped_from_the_queue() {
    let cluster = Cluster::start(3).await;
    let at = cluster.cluster_client();
    let holder = at.open_session("holder", LONG_TTL).await.expect("open");
    let short = at.open_session("short", SHORT_TTL).await.expect("open");
    let held = at
        .try_acquire(&holder.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let sent = Instant::now();
    let pending = spawn_waiter(&at, &short.id, "k");
    wait_for_waiters(&at, "k", 1).await;
    assert!(
        at.locks_of(&short.id).await.expect("locks_of").is_empty(),
        "a queued wait is not a held lock"
    );
    // The waiting session is never heartbeated: it expires and takes its wait with it.
    let (answer, answered_at) =
        tokio::time::timeout(WAITER_MAX_WAIT + Duration::from_secs(5), pending)
            .await
            .expect("the wait answers")
            .expect("no panic");
    let after = answered_at - sent;
    println!("the wait of an expiring session answered {answer:?} after {after:?}");
    match answer {
        Ok(None) | Err(LockError::InvalidArgument { .. }) => {}
        other => panic!("the wait of an expired session answered {other:?}"),
    }
    assert!(
        after < WAITER_MAX_WAIT,
        "the wait outlived its session and ran to max_wait ({after:?})"
    );
    let info = at.inspect("k", true).await.expect("inspect").expect("held");
    assert_eq!(info.waiter_count, 0);
    assert!(
        at.release(&holder.id, "k", held.fencing_token)
            .await
            .expect("release")
    );
    assert_eq!(at.inspect("k", true).await.expect("inspect"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_off_grant_has_its_own_lease() {
    let cluster = Cluster::start(3).await;
    let at = cluster.cluster_client();
    let first = at.open_session("first", LONG_TTL).await.expect("open");
    let second = at.open_session("second", LONG_TTL).await.expect("open");
    let third = at.open_session("third", LONG_TTL).await.expect("open");
    let held = at
        .try_acquire(&first.id, "k", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    // `second` waits with a short lease; it gets the key by hand-off, renews once, then
    // stops renewing: its lease must run out and hand the key on to `third`.
    let second_wait = {
        let at = at.clone();
        let session_id = second.id.clone();
        tokio::spawn(async move {
            at.acquire(&session_id, "k", SHORT_TTL, WAITER_MAX_WAIT)
                .await
        })
    };
    wait_for_waiters(&at, "k", 1).await;
    let third_wait = spawn_waiter(&at, &third.id, "k");
    wait_for_waiters(&at, "k", 2).await;
    assert!(
        at.release(&first.id, "k", held.fencing_token)
            .await
            .expect("release")
    );
    let handed = tokio::time::timeout(WAITER_MAX_WAIT, second_wait)
        .await
        .expect("second answers")
        .expect("no panic")
        .expect("acquire")
        .expect("second is granted by hand-off");
    assert_eq!(handed.ttl_ms, lock_tests::ms(SHORT_TTL));
    let renewed_sent = Instant::now();
    let renewed = at
        .renew(&second.id, "k", handed.fencing_token, SHORT_TTL)
        .await
        .expect("renew")
        .expect("a handed-off grant renews");
    assert_eq!(renewed.fencing_token, handed.fencing_token);
    let (grant, granted_at) = granted(third_wait, "third").await;
    let after = granted_at - renewed_sent;
    println!(
        "handed-off grant of TTL {SHORT_TTL:?} lapsed; third granted {after:?} after the renewal"
    );
    assert!(
        after >= SHORT_TTL,
        "the handed-off lease ended after {after:?}"
    );
    assert!(
        after <= SHORT_TTL + EXPIRY_SLACK,
        "the handed-off lease lasted {after:?}"
    );
    assert_eq!(grant.session_id, third.id);
    assert!(grant.fencing_token > handed.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_older_than_the_request_window_never_grants_twice() {
    /// More requests than lockd remembers per session (`REQUEST_WINDOW` = 64 in the state
    /// machine), so the first request's answer is forgotten.
    const LATER_REQUESTS: usize = 80;
    let cluster = Cluster::start(3).await;
    let at = cluster.cluster_client();
    let session = at.open_session("old-retry", LONG_TTL).await.expect("open");
    let first_id = lock_tests::next_request_id();
    let first = at
        .try_acquire_with_request_id(&session.id, first_id, "k0", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    for i in 0..LATER_REQUESTS {
        at.try_acquire(&session.id, &format!("later-{i}"), LONG_TTL)
            .await
            .expect("try_acquire")
            .expect("granted");
    }
    // One attempt, no retries: a forgotten request id must not be executed again.
    let once = at.with_retry_for(Duration::ZERO);
    match once
        .try_acquire_with_request_id(&session.id, first_id, "k0", LONG_TTL)
        .await
    {
        Ok(Some(grant)) if grant.fencing_token == first.fencing_token => {}
        Ok(None) => println!("the stale retry answered 'not granted'"),
        Err(e @ (LockError::Contention { .. } | LockError::NotLeader { .. })) => {
            println!("the stale retry answered {e}")
        }
        other => panic!("a retry of a forgotten request answered {other:?}"),
    }
    let info = at
        .inspect("k0", true)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(
        info.fencing_token, first.fencing_token,
        "k0 was granted again"
    );
    assert_eq!(
        at.locks_of(&session.id).await.expect("locks_of").len(),
        LATER_REQUESTS + 1
    );
}

/// A blocking acquire queued behind a holder, retried (same request id) with no wait left — what
/// the SDK sends when its retry comes after `max_wait` — answers "not granted" and withdraws the
/// waiter, instead of an unknown outcome that leaves the waiter queued for a grant nobody takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_no_wait_left_withdraws_the_queued_waiter() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.leader_client().await;
    let holder = leader.open_session("t20-holder", LONG_TTL).await.unwrap();
    let held = leader
        .try_acquire(&holder.id, "t20/no-wait-left", LONG_TTL)
        .await
        .unwrap()
        .expect("a fresh key is free");
    let waiter = leader.open_session("t20-waiter", LONG_TTL).await.unwrap();
    let request_id = lock_tests::next_request_id();
    let first = {
        let (leader, id) = (leader.clone(), waiter.id.clone());
        tokio::spawn(async move {
            leader
                .acquire_with_request_id(
                    &id,
                    request_id,
                    "t20/no-wait-left",
                    LONG_TTL,
                    WAITER_MAX_WAIT,
                )
                .await
        })
    };
    let waiters = |leader: lock_tests::NodeClient| async move {
        leader
            .inspect("t20/no-wait-left", true)
            .await
            .map_err(|e| e.to_string())?
            .map(|info| info.waiter_count)
            .ok_or_else(|| "the key is not held".to_owned())
    };
    poll_until("the first attempt queued", EXPIRY_SLACK, || {
        let leader = leader.clone();
        async move {
            match waiters(leader).await? {
                1 => Ok(()),
                n => Err(format!("{n} waiters")),
            }
        }
    })
    .await
    .unwrap();

    let retry = leader
        .acquire_with_request_id(
            &waiter.id,
            request_id,
            "t20/no-wait-left",
            LONG_TTL,
            Duration::ZERO,
        )
        .await;
    assert!(matches!(retry, Ok(None)), "the retry answered {retry:?}");
    assert_eq!(
        waiters(leader.clone()).await,
        Ok(0),
        "the waiter was withdrawn"
    );
    // The first attempt learns the same: not granted.
    let first = first.await.unwrap();
    assert!(
        matches!(first, Ok(None)),
        "the first attempt answered {first:?}"
    );
    // The release leaves the key free: no orphan grant for the withdrawn waiter.
    assert!(
        leader
            .release(&holder.id, "t20/no-wait-left", held.fencing_token)
            .await
            .unwrap()
    );
    assert_eq!(
        leader.inspect("t20/no-wait-left", true).await.unwrap(),
        None
    );
}
