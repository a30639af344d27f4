//! The conformance suite (issue 8) against the PostgreSQL store (`lockd::store::pg`), on the
//! database named by `LOCKD_TEST_PG_URL` (scripts/test-services.sh starts a private one).
//! Fails, naming `scripts/test`, when the variable is unset: it never passes untested. Runs the
//! C2 cases, then the `RequestStore` cases (conformance/requests.rs), the last of which
//! terminates the store's `LISTEN` connection.

mod conformance;

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use conformance::proxy::Proxy;
use conformance::requests::{RequestBackend, WAIT_LONG, WAKE_WAIT_MAX, run_request_suite};
use conformance::{Backend, Cut, Cuttable, POLL_INTERVAL, backend_setting, run_suite};
use lock_api::limits::REQUEST_RETENTION;
use lock_api::{Acquired, LockError, LockStore, RequestStore, SessionRegistry};
use lockd::store::pg::{LISTEN_APPLICATION_NAME, PgLockStore};

/// How long the store may take to (re)establish its `LISTEN` connection.
const LISTEN_WAIT_MAX: Duration = Duration::from_secs(20);

/// The `LISTEN` connection's pid once `store` listens.
async fn listening(store: &PgLockStore) -> i32 {
    let deadline = Instant::now() + LISTEN_WAIT_MAX;
    loop {
        if let Some(pid) = store.listen_pid() {
            return pid;
        }
        assert!(Instant::now() < deadline, "the store never listened");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Terminates `store`'s `LISTEN` connection from another connection, as a failover or an
/// operator would, and returns once the store has noticed (so what the case does next happens
/// while nothing listens: the first reconnect waits `LISTEN_BACKOFF_MIN`).
async fn terminate_listener(url: String, store: PgLockStore) {
    let pid = listening(&store).await;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("an admin connection");
    let driver = tokio::spawn(connection);
    let name: String = client
        .query_one(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .expect("pg_stat_activity")
        .get(0);
    assert_eq!(
        name, LISTEN_APPLICATION_NAME,
        "pid {pid} is the store's listener"
    );
    let killed: bool = client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("pg_terminate_backend")
        .get(0);
    assert!(killed, "terminated the LISTEN connection {pid}");
    drop(client);
    driver.abort();
    let deadline = Instant::now() + LISTEN_WAIT_MAX;
    while store.listen_pid() == Some(pid) {
        assert!(
            Instant::now() < deadline,
            "the store never noticed its listener died"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `host:port` of a `postgres://user@host:port/db` URL, to put the proxy in front of.
fn upstream_of(url: &str) -> (SocketAddr, String, String) {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let (auth, rest) = rest.split_once('@').expect("a user@ in the URL");
    let (hostport, path) = rest.split_once('/').expect("a /database in the URL");
    let addr = hostport.parse().expect("a numeric host:port in the URL");
    (addr, format!("{scheme}://{auth}@"), format!("/{path}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_pg() {
    let url = backend_setting("LOCKD_TEST_PG_URL", "pg");
    let store = PgLockStore::connect(&url)
        .await
        .expect("connect to postgres");
    let requests = store.clone();
    // A second store on the same database, through a proxy the last case cuts.
    let (upstream, head, tail) = upstream_of(&url);
    let proxy = Proxy::start(upstream).await.expect("proxy");
    let proxied = PgLockStore::connect(&format!("{head}{}{tail}", proxy.addr()))
        .await
        .expect("connect through the proxy");
    let cut: Cut = Box::new(move || {
        Box::pin(async move {
            proxy.cut();
        })
    });
    let ran = run_suite(
        "pg",
        Backend {
            store,
            background_reaper: false,
            cuttable: Some(Cuttable {
                store: proxied,
                cut,
                shared: false,
            }),
        },
    )
    .await;
    assert_eq!(ran, 14);
    let broken = requests.clone();
    let url_for_admin = url.clone();
    let break_notifications: Cut = Box::new(move || Box::pin(terminate_listener(url, broken)));
    let ran = run_request_suite(
        "pg",
        RequestBackend {
            store: requests.clone(),
            break_notifications: Some(break_notifications),
        },
    )
    .await;
    assert_eq!(ran, 24);
    let pid = listening(&requests).await;
    assert!(pid > 0, "the store listens again after the case cut it");
    a_forgotten_request_is_an_unknown_outcome(&url_for_admin, &requests).await;
    println!("pg a_forgotten_request_is_an_unknown_outcome ok");
    let other_node = PgLockStore::connect(&url_for_admin)
        .await
        .expect("a second store on the database");
    a_hand_off_wakes_a_waiter_on_another_node(&requests, &other_node).await;
    println!("pg a_hand_off_wakes_a_waiter_on_another_node ok");
}

/// Two nodes on one database: a release through one wakes a waiter waiting through the other
/// (its own `LISTEN` connection), as every node serves the same lock table.
async fn a_hand_off_wakes_a_waiter_on_another_node(a: &PgLockStore, b: &PgLockStore) {
    let key = format!("conf/{}/pg/two-nodes", conformance::run_nonce());
    listening(b).await;
    let (holder, _) = a
        .open_session_with_ttl("holder", conformance::SESSION_TTL_LONG)
        .await
        .expect("open");
    let (waiter, _) = b
        .open_session_with_ttl("waiter", conformance::SESSION_TTL_LONG)
        .await
        .expect("open");
    let h = match a
        .acquire_request(&holder, 1, &key, conformance::LOCK_TTL_LONG, Duration::ZERO)
        .await
    {
        Ok(Acquired::Granted(h)) => h,
        other => panic!("a free key answered {other:?}"),
    };
    assert_eq!(
        b.acquire_request(&waiter, 1, &key, conformance::LOCK_TTL_LONG, WAIT_LONG)
            .await,
        Ok(Acquired::Queued)
    );
    let wait = {
        let (b, waiter, key) = (b.clone(), waiter.clone(), key.clone());
        tokio::spawn(async move { b.wait_for_grant(&waiter, 1, &key).await })
    };
    assert_eq!(
        a.release_request(&holder, 2, &key, h.fencing_token).await,
        Ok(true)
    );
    let got = tokio::time::timeout(WAKE_WAIT_MAX, wait)
        .await
        .expect("the other node's waiter woke")
        .expect("wait task")
        .expect("wait_for_grant")
        .expect("granted");
    assert!(got.fencing_token > h.fencing_token);
    assert_eq!(got.session_id, waiter);
    assert_eq!(a.close_session(&holder).await, Ok(0));
    assert_eq!(a.close_session(&waiter).await, Ok(1));
}

/// PostgreSQL forgets answers after `REQUEST_RETENTION` (the Raft store after its window); a
/// retry of a forgotten request must be "unknown outcome", never a second effect or a guess.
/// The case ages the answers with SQL instead of waiting ten minutes.
async fn a_forgotten_request_is_an_unknown_outcome(url: &str, store: &PgLockStore) {
    let key = format!("conf/{}/pg/forgotten", conformance::run_nonce());
    let (s, _) = store
        .open_session_with_ttl("owner-a", conformance::SESSION_TTL_LONG)
        .await
        .expect("open");
    let h = match store
        .acquire_request(&s, 5, &key, conformance::LOCK_TTL_LONG, Duration::ZERO)
        .await
    {
        Ok(Acquired::Granted(h)) => h,
        other => panic!("a free key answered {other:?}"),
    };
    assert_eq!(
        store.release_request(&s, 6, &key, h.fencing_token).await,
        Ok(true)
    );
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("an admin connection");
    let driver = tokio::spawn(connection);
    let aged = client
        .execute(
            "UPDATE lock_request SET created_at = now() - $2::bigint * interval '1 millisecond'
             WHERE session_id = $1",
            &[&s, &(REQUEST_RETENTION.as_millis() as i64 + 60_000)],
        )
        .await
        .expect("age the answers");
    assert_eq!(aged, 2);
    store.reap_expired(SystemTime::now()).await.expect("reap");
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM lock_request WHERE session_id = $1",
            &[&s],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 0, "the reaper forgot the aged answers");
    drop(client);
    driver.abort();
    match store
        .acquire_request(&s, 5, &key, conformance::LOCK_TTL_LONG, Duration::ZERO)
        .await
    {
        Err(LockError::Contention { .. }) => {}
        other => panic!("a forgotten acquire must be an unknown outcome, got {other:?}"),
    }
    match store.release_request(&s, 6, &key, h.fencing_token).await {
        Err(LockError::Contention { .. }) => {}
        other => panic!("a forgotten release must be an unknown outcome, got {other:?}"),
    }
    assert_eq!(store.read(&key).await, Ok(None), "the retries did nothing");
    match store
        .acquire_request(&s, 7, &key, conformance::LOCK_TTL_LONG, Duration::ZERO)
        .await
    {
        Ok(Acquired::Granted(g)) => assert!(g.fencing_token > h.fencing_token),
        other => panic!("a new request id is served, got {other:?}"),
    }
    assert_eq!(store.close_session(&s).await, Ok(1));
}
