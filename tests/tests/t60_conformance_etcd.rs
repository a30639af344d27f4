//! The conformance suite (issue 8) against the etcd store (`lockd::store::etcd`), on the etcd
//! cluster named by `LOCKD_TEST_ETCD_ENDPOINTS` (comma-separated `http://host:port`;
//! scripts/test-services.sh starts a private three-member one). Fails, naming `scripts/test`,
//! when the variable is unset: it never passes untested.

mod conformance;

use std::net::SocketAddr;

use conformance::proxy::Proxy;
use conformance::{Backend, Cut, Cuttable, backend_setting, run_nonce, run_suite};
use lockd::store::etcd::EtcdLockStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_etcd() {
    let setting = backend_setting("LOCKD_TEST_ETCD_ENDPOINTS", "etcd");
    let endpoints: Vec<String> = setting.split(',').map(|s| s.trim().to_owned()).collect();
    // A prefix of this run's own: nothing left by an earlier run is in the way.
    let prefix = format!("lockd-conformance/{}/", run_nonce());
    let store = EtcdLockStore::connect(&endpoints, &prefix)
        .await
        .expect("connect to etcd");
    // A second store on the same cluster, through a proxy to one member, that the last case cuts.
    let first: SocketAddr = endpoints[0]
        .trim_start_matches("http://")
        .parse()
        .expect("a numeric http://host:port endpoint");
    let proxy = Proxy::start(first).await.expect("proxy");
    let proxied = EtcdLockStore::connect(&[format!("http://{}", proxy.addr())], &prefix)
        .await
        .expect("connect through the proxy");
    let cut: Cut = Box::new(move || {
        Box::pin(async move {
            proxy.cut();
        })
    });
    let ran = run_suite(
        "etcd",
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
