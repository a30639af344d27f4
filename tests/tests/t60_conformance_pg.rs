//! The conformance suite (issue 8) against the PostgreSQL store (`lockd::store::pg`), on the
//! database named by `LOCKD_TEST_PG_URL` (scripts/test-services.sh starts a private one).
//! Fails, naming `scripts/test`, when the variable is unset: it never passes untested.

mod conformance;

use std::net::SocketAddr;

use conformance::proxy::Proxy;
use conformance::{Backend, Cut, Cuttable, backend_setting, run_suite};
use lockd::store::pg::PgLockStore;

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
}
