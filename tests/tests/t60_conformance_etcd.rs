//! The conformance suite (issue 8) against the etcd store (`lockd::store::etcd`), on the etcd
//! cluster named by `LOCKD_TEST_ETCD_ENDPOINTS` (comma-separated `http://host:port`;
//! scripts/test-services.sh starts a private three-member one). Fails, naming `scripts/test`,
//! when the variable is unset: it never passes untested.
//!
//! Runs the C2 cases, then the `RequestStore` cases (conformance/requests.rs) on a store that
//! talks to one member only, whose notification channel — the store's watch stream — the last
//! case breaks by restarting that member; then a case of its own: a hand-off made while the
//! waiter's only member is down reaches the waiter once the member is back; and that a retry
//! of a request whose record `reap_expired` forgot is "unknown outcome". Restarting a
//! member needs the services folder (`LOCKD_TEST_SERVICES_DIR`, which scripts/test-services.sh
//! exports with the endpoints): the member's command line is read from its pid and it is
//! started again the same way, on the same data, its new pid written back for `stop`.

mod conformance;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use conformance::proxy::Proxy;
use conformance::requests::{RequestBackend, WAIT_LONG, WAKE_WAIT_MAX, run_request_suite};
use conformance::{
    Backend, Cut, Cuttable, LOCK_TTL_LONG, POLL_INTERVAL, SESSION_TTL_LONG, backend_setting,
    run_nonce, run_suite,
};
use lock_api::limits::REQUEST_RETENTION;
use lock_api::{Acquired, LockError, LockStore, RequestStore, SessionRegistry};
use lockd::store::etcd::EtcdLockStore;
use rustix::process::{Pid, Signal, kill_process, test_kill_process};

/// How long a stopped member may take to exit, and a started one to serve again.
const MEMBER_WAIT_MAX: Duration = Duration::from_secs(30);

/// One member of the test cluster, found by its client URL.
struct Member {
    pidfile: PathBuf,
    log: PathBuf,
    argv: Vec<String>,
    /// The process, once this test started it (so a second stop reaps it).
    child: Option<Child>,
}

impl Member {
    /// The member serving `endpoint` (`http://127.0.0.1:port`).
    fn serving(endpoint: &str) -> Member {
        let dir = std::env::var("LOCKD_TEST_SERVICES_DIR").unwrap_or_else(|_| {
            panic!(
                "LOCKD_TEST_SERVICES_DIR is unset: the etcd cases restart a member of the \
                 cluster scripts/test-services.sh started (run `eval \"$(scripts/test-services.sh \
                 start)\"`, which exports it with the endpoints)"
            )
        });
        for entry in std::fs::read_dir(&dir).expect("the services folder") {
            let member_dir = entry.expect("a folder entry").path();
            let pidfile = member_dir.join("pid");
            let is_etcd = member_dir
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("etcd-"));
            if !is_etcd || !pidfile.exists() {
                continue;
            }
            let pid = std::fs::read_to_string(&pidfile).expect("the pid file");
            let cmdline =
                std::fs::read(format!("/proc/{}/cmdline", pid.trim())).unwrap_or_else(|e| {
                    panic!("member {member_dir:?} (pid {pid}) is not running: {e}")
                });
            let argv: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if argv.iter().any(|a| a == endpoint) {
                return Member {
                    pidfile,
                    log: member_dir.join("log"),
                    argv,
                    child: None,
                };
            }
        }
        panic!("no etcd member of {dir} serves {endpoint}");
    }

    /// Stops the member (SIGTERM) and waits until its process is gone.
    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill the restarted member");
            child.wait().expect("reap the restarted member");
            return;
        }
        let pid: i32 = std::fs::read_to_string(&self.pidfile)
            .expect("the pid file")
            .trim()
            .parse()
            .expect("a pid");
        let pid = Pid::from_raw(pid).expect("a positive pid");
        kill_process(pid, Signal::TERM).expect("signal the member");
        let deadline = Instant::now() + MEMBER_WAIT_MAX;
        while test_kill_process(pid).is_ok() {
            assert!(
                Instant::now() < deadline,
                "the member did not exit within {MEMBER_WAIT_MAX:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Starts the member again with its own command line and data, and waits until `probe`
    /// (a store that talks to this member only) is served.
    async fn start(&mut self, probe: &EtcdLockStore) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .expect("the member's log");
        let child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("start the member again");
        std::fs::write(&self.pidfile, child.id().to_string()).expect("write the pid back");
        self.child = Some(child);
        let deadline = Instant::now() + MEMBER_WAIT_MAX;
        while probe.read("probe").await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the restarted member did not serve within {MEMBER_WAIT_MAX:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_etcd() {
    let setting = backend_setting("LOCKD_TEST_ETCD_ENDPOINTS", "etcd");
    let endpoints: Vec<String> = setting.split(',').map(|s| s.trim().to_owned()).collect();
    assert!(
        endpoints.len() >= 3,
        "the cases need a three-member cluster"
    );
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
            store: store.clone(),
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

    // The request cases on a store bound to one member, so that restarting that member is
    // sure to break the store's watch stream.
    let one_member = endpoints[1].clone();
    let requests = EtcdLockStore::connect(std::slice::from_ref(&one_member), &prefix)
        .await
        .expect("connect to one member");
    let member = Arc::new(Mutex::new(Some(Member::serving(&one_member))));
    let restarted = member.clone();
    let probe = requests.clone();
    let break_notifications: Cut = Box::new(move || {
        Box::pin(async move {
            let mut m = restarted
                .lock()
                .expect("the member")
                .take()
                .expect("restarted once");
            m.stop().await;
            m.start(&probe).await;
            *restarted.lock().expect("the member") = Some(m);
        })
    });
    let ran = run_request_suite(
        "etcd",
        RequestBackend {
            store: requests.clone(),
            break_notifications: Some(break_notifications),
        },
    )
    .await;
    assert_eq!(ran, 24);

    let t = Instant::now();
    let rest: Vec<String> = endpoints
        .iter()
        .filter(|e| **e != one_member)
        .cloned()
        .collect();
    let others = EtcdLockStore::connect(&rest, &prefix)
        .await
        .expect("connect to the other members");
    let mut m = member
        .lock()
        .expect("the member")
        .take()
        .expect("the member is back");
    a_hand_off_while_the_waiters_member_is_down_reaches_it(&others, &requests, &mut m, &prefix)
        .await;
    println!(
        "etcd a_hand_off_while_the_waiters_member_is_down_reaches_it ok ({} ms)",
        t.elapsed().as_millis()
    );

    let t = Instant::now();
    a_forgotten_request_is_an_unknown_outcome(&endpoints, &prefix).await;
    println!(
        "etcd a_forgotten_request_is_an_unknown_outcome ok ({} ms)",
        t.elapsed().as_millis()
    );
}

/// Request records live `REQUEST_RETENTION`; past it `reap_expired` forgets them, and a retry
/// of a forgotten request is "unknown outcome" (`Contention`), never taken for a new request.
/// Time passes by the `now` handed to `reap_expired`, on a prefix of the case's own (that reap
/// expires everything under it).
async fn a_forgotten_request_is_an_unknown_outcome(endpoints: &[String], prefix: &str) {
    let store = EtcdLockStore::connect(endpoints, &format!("{prefix}forget/"))
        .await
        .expect("connect");
    let key = "conf/forget/0";
    let (s, _) = store
        .open_session_with_ttl("forgetful", SESSION_TTL_LONG)
        .await
        .expect("open");
    let Ok(Acquired::Granted(h)) = store
        .acquire_request(&s, 1, key, LOCK_TTL_LONG, Duration::ZERO)
        .await
    else {
        panic!("a free key was not granted");
    };
    assert_eq!(
        store.release_request(&s, 2, key, h.fencing_token).await,
        Ok(true)
    );
    // Within the retention, retries get their first answers.
    assert_eq!(
        store
            .acquire_request(&s, 1, key, LOCK_TTL_LONG, Duration::ZERO)
            .await
            .map(|a| match a {
                Acquired::Granted(g) => g.fencing_token,
                other => panic!("the retry answered {other:?}"),
            }),
        Ok(h.fencing_token)
    );
    assert_eq!(
        store.release_request(&s, 2, key, h.fencing_token).await,
        Ok(true)
    );
    let later = SystemTime::now() + REQUEST_RETENTION + Duration::from_secs(60);
    store.reap_expired(later).await.expect("reap");
    let unknown = |r: Result<_, LockError>, what: &str| {
        assert!(
            matches!(r, Err(LockError::Contention { .. })),
            "{what} of a forgotten request: {r:?}"
        );
    };
    unknown(
        store
            .acquire_request(&s, 1, key, LOCK_TTL_LONG, Duration::ZERO)
            .await
            .map(|_| ()),
        "an acquire",
    );
    unknown(
        store
            .release_request(&s, 2, key, h.fencing_token)
            .await
            .map(|_| ()),
        "a release",
    );
    unknown(
        store.cancel_request(&s, 1, key, true).await.map(|_| ()),
        "a cancel",
    );
    assert_eq!(
        store.read(key).await,
        Ok(None),
        "the retries changed nothing"
    );
    // A new request is served as ever.
    let Ok(Acquired::Granted(next)) = store
        .acquire_request(&s, 3, key, LOCK_TTL_LONG, Duration::ZERO)
        .await
    else {
        panic!("a new request after the forgotten ones was not granted");
    };
    assert!(next.fencing_token > h.fencing_token);
    assert_eq!(store.close_session(&s).await, Ok(1));
}

/// The waiter's store talks only to `member`, `others` to the other members; the member stops;
/// the holder releases through the others, which hands the key to the waiter while the waiter's watch stream is
/// down; the member starts again, and the waiter learns of its grant (the stream is
/// re-established and the watch resumes where it was).
async fn a_hand_off_while_the_waiters_member_is_down_reaches_it(
    others: &EtcdLockStore,
    waiters: &EtcdLockStore,
    member: &mut Member,
    prefix: &str,
) {
    let key = format!("conf/{prefix}outage/0");
    let (holder, _) = others
        .open_session_with_ttl("holder", SESSION_TTL_LONG)
        .await
        .expect("open holder");
    let Acquired::Granted(h) = others
        .acquire_request(&holder, 1, &key, LOCK_TTL_LONG, Duration::ZERO)
        .await
        .expect("acquire")
    else {
        panic!("a free key was not granted");
    };
    let (waiter, _) = waiters
        .open_session_with_ttl("waiter", SESSION_TTL_LONG)
        .await
        .expect("open waiter");
    assert_eq!(
        waiters
            .acquire_request(&waiter, 1, &key, LOCK_TTL_LONG, WAIT_LONG)
            .await,
        Ok(Acquired::Queued)
    );
    let store = waiters.clone();
    let (s, k) = (waiter.clone(), key.clone());
    let wait = tokio::spawn(async move { store.wait_for_grant(&s, 1, &k).await });
    // Let the wait reach its watch: a read of the waiter's state through the same member.
    assert_eq!(
        waiters.read(&key).await.map(|i| i.map(|i| i.waiter_count)),
        Ok(Some(1))
    );
    member.stop().await;
    // Through the other members: released, and handed to the waiter in the same step.
    let released = others
        .release_request(&holder, 2, &key, h.fencing_token)
        .await;
    assert_eq!(released, Ok(true), "release while one member is down");
    let info = others.read(&key).await.expect("read").expect("handed off");
    assert_eq!(info.session_id, waiter, "the waiter holds the key");
    assert!(
        !wait.is_finished(),
        "the waiter's member is down: it cannot have heard yet"
    );
    member.start(waiters).await;
    let granted = tokio::time::timeout(WAKE_WAIT_MAX, wait)
        .await
        .expect("the waiter learns of its grant once its member is back")
        .expect("wait task")
        .expect("wait_for_grant");
    let granted = granted.expect("granted, not dropped");
    assert_eq!(granted.fencing_token, info.fencing_token);
    assert_eq!(granted.session_id, waiter);
    assert_eq!(others.close_session(&waiter).await, Ok(1));
    others.close_session(&holder).await.expect("close holder");
}
