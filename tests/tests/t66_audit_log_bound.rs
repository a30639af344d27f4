//! The force-revoke audit log keeps exactly the newest `AUDIT_LOG_MAX` revokes on every
//! backend (docs/SECURITY.md §4): after more revokes than that, the log lists the newest
//! `AUDIT_LOG_MAX` of them, newest first, and nothing older — and the PostgreSQL and etcd stores
//! have really deleted the rest, so their storage is bounded too, not only what they answer.
//!
//! Each backend runs in a namespace of its own — a fresh one-node Raft cluster through gRPC, a
//! PostgreSQL database created for the test, an etcd prefix of the run — because filling the
//! log of a shared database would push the records of other tests running at the same time
//! out of it. The PostgreSQL and etcd cases fail, naming `scripts/test`, when their variable is
//! unset: they never pass untested.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use lock_api::limits::AUDIT_LOG_MAX;
use lock_api::{LockError, RequestStore};
use lock_proto::v1::ListRevocationsRequest;
use lock_tests::Cluster;
use lock_tests::pki::HARNESS_IDENTITY;
use tokio::task::JoinSet;

/// Revokes past the bound: enough that a store keeping one record too many, or trimming one
/// revoke late, shows.
const EXTRA: usize = 8;

/// Revokes in flight at once (the log's order is the floors', whatever the arrival order).
const CONCURRENCY: usize = 8;

/// The one key every revoke here names.
const KEY: &str = "t66/audit-bound";

fn nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}{}", std::process::id())
}

fn setting(var: &str) -> String {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => value,
        _ => panic!(
            "{var} is unset, so this backend's audit bound cannot be tested. Run the tests with \
             `scripts/test`, or start the services with `eval \"$(scripts/test-services.sh \
             start)\"` first"
        ),
    }
}

/// Revokes [`KEY`] `AUDIT_LOG_MAX + EXTRA` times through `revoke` and returns every floor.
async fn revoke_past_the_bound<F, Fut>(revoke: F) -> Vec<u64>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<u64, LockError>> + Send + 'static,
{
    let revoke = Arc::new(revoke);
    let total = AUDIT_LOG_MAX + EXTRA;
    let mut floors = Vec::with_capacity(total);
    let mut running: JoinSet<Result<u64, LockError>> = JoinSet::new();
    for n in 0..total {
        if running.len() >= CONCURRENCY
            && let Some(done) = running.join_next().await
        {
            floors.push(done.expect("a revoke task").expect("revoke"));
        }
        let revoke = revoke.clone();
        running.spawn(async move { revoke(n).await });
    }
    while let Some(done) = running.join_next().await {
        floors.push(done.expect("a revoke task").expect("revoke"));
    }
    floors
}

/// Checks that `listed` (the whole log as a client paged through it) is exactly the newest
/// `AUDIT_LOG_MAX` of `floors`, newest first.
fn check_log(what: &str, floors: &[u64], listed: &[u64]) {
    let unique: BTreeSet<u64> = floors.iter().copied().collect();
    assert_eq!(
        unique.len(),
        floors.len(),
        "{what}: every revoke has its own floor"
    );
    let newest: Vec<u64> = unique.iter().rev().take(AUDIT_LOG_MAX).copied().collect();
    assert_eq!(
        listed.len(),
        AUDIT_LOG_MAX,
        "{what}: after {} revokes the log lists {} records, not AUDIT_LOG_MAX",
        floors.len(),
        listed.len()
    );
    assert_eq!(
        listed, newest,
        "{what}: the log is not the newest AUDIT_LOG_MAX revokes, newest first"
    );
}

/// The whole log of `store`, page by page through `RequestStore::revocations`.
async fn store_log<S: RequestStore>(store: &S) -> Vec<u64> {
    let mut listed: Vec<u64> = Vec::new();
    loop {
        let page = store
            .revocations(
                None,
                listed.last().copied(),
                lock_proto::audit::REVOCATIONS_PAGE_SIZE_MAX,
            )
            .await
            .expect("revocations");
        if page.is_empty() {
            return listed;
        }
        listed.extend(page.iter().map(|r| r.new_token_floor));
        assert!(
            listed.len() <= AUDIT_LOG_MAX + EXTRA,
            "the listing does not end"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t66_raft_keeps_the_newest_audit_log_max_revokes() {
    let mut cluster = Cluster::start(1).await;
    let node = cluster.leader_client().await;
    let revoker = node.clone();
    let floors = revoke_past_the_bound(move |n| {
        let node = revoker.clone();
        async move {
            node.force_revoke(KEY, HARNESS_IDENTITY, &format!("t66: {n}"))
                .await
                .map(|o| o.new_token_floor)
        }
    })
    .await;
    let mut admin = node.admin_service();
    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let page = admin
            .list_revocations(ListRevocationsRequest {
                key: String::new(),
                page_size: 0,
                page_token: token,
            })
            .await
            .expect("ListRevocations")
            .into_inner();
        listed.extend(page.revocations.iter().map(|r| r.new_token_floor));
        assert!(
            listed.len() <= AUDIT_LOG_MAX + EXTRA,
            "the listing does not end"
        );
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    check_log("raft", &floors, &listed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t66_pg_keeps_and_stores_only_the_newest_audit_log_max_revokes() {
    let url = setting("LOCKD_TEST_PG_URL");
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("an admin connection");
    let driver = tokio::spawn(connection);
    let database = format!("lockd_t66_{}", nonce());
    admin
        .execute(&format!("CREATE DATABASE {database}"), &[])
        .await
        .expect("create the test's database");
    let (head, _) = url.rsplit_once('/').expect("a /database in the URL");
    let own_url = format!("{head}/{database}");
    let store = lockd::store::pg::PgLockStore::connect(&own_url)
        .await
        .expect("connect to the test's database");
    let revoker = store.clone();
    let floors = revoke_past_the_bound(move |n| {
        let store = revoker.clone();
        async move {
            store
                .revoke_request(KEY, "t66", &format!("t66: {n}"), 0)
                .await
                .map(|o| o.new_token_floor)
        }
    })
    .await;
    check_log("pg", &floors, &store_log(&store).await);
    let (rows, _) = tokio_postgres::connect(&own_url, tokio_postgres::NoTls)
        .await
        .map(|(client, connection)| {
            tokio::spawn(connection);
            (client, ())
        })
        .expect("a connection to the test's database");
    let stored: i64 = rows
        .query_one("SELECT count(*) FROM lock_revocation", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(
        stored, AUDIT_LOG_MAX as i64,
        "pg: lock_revocation holds {stored} rows after the trims, not AUDIT_LOG_MAX"
    );
    drop(rows);
    drop(store);
    // Best effort: the store's pooled connections may still be closing.
    let _ = admin
        .execute(&format!("DROP DATABASE {database} WITH (FORCE)"), &[])
        .await;
    driver.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t66_etcd_keeps_and_stores_only_the_newest_audit_log_max_revokes() {
    let endpoints: Vec<String> = setting("LOCKD_TEST_ETCD_ENDPOINTS")
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    let prefix = format!("lockd-t66/{}/", nonce());
    let store = lockd::store::etcd::EtcdLockStore::connect(&endpoints, &prefix)
        .await
        .expect("connect to etcd");
    let revoker = store.clone();
    let floors = revoke_past_the_bound(move |n| {
        let store = revoker.clone();
        async move {
            store
                .revoke_request(KEY, "t66", &format!("t66: {n}"), 0)
                .await
                .map(|o| o.new_token_floor)
        }
    })
    .await;
    check_log("etcd", &floors, &store_log(&store).await);

    use lock_proto::etcd::etcdserverpb::RangeRequest;
    use lock_proto::etcd::etcdserverpb::kv_client::KvClient;
    let mut kv = KvClient::connect(endpoints[0].clone())
        .await
        .expect("an etcd client");
    let start = format!("{prefix}revocation/").into_bytes();
    let mut end = start.clone();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let stored = kv
        .range(RangeRequest {
            key: start,
            range_end: end,
            count_only: true,
            ..Default::default()
        })
        .await
        .expect("count the revocation keys")
        .into_inner()
        .count;
    assert_eq!(
        stored, AUDIT_LOG_MAX as i64,
        "etcd: {stored} revocation keys after the trims, not AUDIT_LOG_MAX"
    );
}
