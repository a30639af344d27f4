//! Bad input: blank, oversized and malformed arguments, out-of-bounds TTLs and waits, unknown
//! sessions, a release with the wrong token, and bytes that are not gRPC at all.
//!
//! Each case must get a clear error (`InvalidArgument` where the contract says so) or its
//! documented outcome, and leave the node serving and every held lock exactly as it was.

use std::time::Duration;

use lock_api::limits::{
    KEY_LEN_MAX, MAX_WAIT_MAX, OPERATOR_LEN_MAX, OWNER_ID_LEN_MAX, REASON_LEN_MAX,
    SESSION_ID_LEN_MAX, TTL_MAX, TTL_MIN,
};
use lock_tests::raw::{raw_grpc_unary_on, send_tcp_bytes};
use lock_tests::{Cluster, ClusterClient, ClusterConfig, Grant, LockError, Session};

/// Lease of grants and sessions that must not expire during a test.
const LONG_TTL: Duration = Duration::from_secs(60);

/// How long the harness listens for a node's reaction to junk bytes.
const JUNK_READ_FOR: Duration = Duration::from_secs(2);

/// A cluster with one held lock, and the checks that nothing bad input does harms it.
struct Fixture {
    cluster: Cluster,
    leader: u64,
    /// Leader-following, so a transient `Contention` on a loaded machine is retried; invalid
    /// arguments are never retried and come back as they are.
    at: ClusterClient,
    holder: Session,
    held: Grant,
}

impl Fixture {
    async fn new() -> Self {
        let mut cluster = Cluster::start(3).await;
        let holder = cluster
            .cluster_client()
            .open_session("holder", LONG_TTL)
            .await
            .expect("open");
        let leader = cluster.leader().await;
        let at = cluster.cluster_client();
        let held = at
            .try_acquire(&holder.id, "held", LONG_TTL)
            .await
            .expect("try_acquire")
            .expect("granted");
        Self {
            cluster,
            leader,
            at,
            holder,
            held,
        }
    }

    /// Every node still answers `Status` and knows a leader, and the held lock inspects the
    /// same (owner, session, token).
    async fn assert_unharmed(&self, after: &str) {
        for id in self.cluster.ids() {
            let status = self.cluster.status(id).await.unwrap_or_else(|e| {
                panic!("after {after}: node {id} no longer answers Status: {e}")
            });
            assert!(
                status.leader_id.is_some(),
                "after {after}: node {id} knows no leader"
            );
        }
        let info = self
            .at
            .inspect("held", true)
            .await
            .unwrap_or_else(|e| panic!("after {after}: inspect failed: {e}"))
            .unwrap_or_else(|| panic!("after {after}: the held lock is gone"));
        assert_eq!(
            (
                info.owner_id.as_str(),
                info.session_id.as_str(),
                info.fencing_token
            ),
            ("holder", self.holder.id.as_str(), self.held.fencing_token),
            "after {after}: the held lock changed"
        );
    }
}

/// Asserts `answer` is `InvalidArgument`, and returns its message (printed, for the report).
fn assert_invalid<T: std::fmt::Debug>(answer: Result<T, LockError>, what: &str) -> String {
    match answer {
        Err(LockError::InvalidArgument { message }) => {
            assert!(
                !message.trim().is_empty(),
                "{what}: InvalidArgument with an empty message"
            );
            println!("{what}: InvalidArgument: {message}");
            message
        }
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blank_oversized_and_control_character_keys_are_invalid() {
    let f = Fixture::new().await;
    let sid = f.holder.id.as_str();
    let oversized = "k".repeat(KEY_LEN_MAX + 1);
    let large = "k".repeat(64 * 1024);
    for (name, key) in [
        ("empty key", ""),
        ("blank key", "   "),
        ("oversized key", oversized.as_str()),
        ("64 KiB key", large.as_str()),
        ("key with a newline", "a\nb"),
    ] {
        assert_invalid(
            f.at.acquire(sid, key, LONG_TTL, Duration::ZERO).await,
            &format!("Acquire, {name}"),
        );
        assert_invalid(
            f.at.try_acquire(sid, key, LONG_TTL).await,
            &format!("TryAcquire, {name}"),
        );
        assert_invalid(
            f.at.renew(sid, key, f.held.fencing_token, LONG_TTL).await,
            &format!("Renew, {name}"),
        );
        assert_invalid(
            f.at.release(sid, key, f.held.fencing_token).await,
            &format!("Release, {name}"),
        );
        assert_invalid(f.at.inspect(key, true).await, &format!("Inspect, {name}"));
        assert_invalid(
            f.at.force_revoke(key, "op", "reason").await,
            &format!("ForceRevoke, {name}"),
        );
        f.assert_unharmed(name).await;
    }
    // A request above the node's gRPC message-size limit is refused by the transport before
    // lockd sees it (tonic answers OutOfRange, with no lockd detail). It must decode as
    // InvalidArgument: the same request fails the same way every time, so a retry-safe
    // Contention would make a client retry it forever.
    let huge = "k".repeat(2 * 1024 * 1024);
    match f.at.try_acquire(sid, &huge, LONG_TTL).await {
        Err(LockError::InvalidArgument { message }) => {
            println!("TryAcquire, 2 MiB key: InvalidArgument: {message}")
        }
        other => panic!("TryAcquire, 2 MiB key: expected InvalidArgument, got {other:?}"),
    }
    f.assert_unharmed("a 2 MiB key").await;
    // The limit itself is allowed.
    let longest = "k".repeat(KEY_LEN_MAX);
    let grant =
        f.at.try_acquire(sid, &longest, LONG_TTL)
            .await
            .expect("a key of exactly KEY_LEN_MAX bytes is valid")
            .expect("granted");
    assert!(grant.fencing_token > f.held.fencing_token);
    f.assert_unharmed("the longest key").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_and_waits_outside_the_limits_are_invalid() {
    let f = Fixture::new().await;
    let sid = f.holder.id.as_str();
    let over = TTL_MAX + Duration::from_millis(1);
    let under = TTL_MIN - Duration::from_millis(1);
    for (name, ttl) in [
        ("ttl 0", Duration::ZERO),
        ("ttl below the minimum", under),
        ("ttl above the maximum", over),
    ] {
        assert_invalid(
            f.at.acquire(sid, "k", ttl, Duration::ZERO).await,
            &format!("Acquire, {name}"),
        );
        assert_invalid(
            f.at.try_acquire(sid, "k", ttl).await,
            &format!("TryAcquire, {name}"),
        );
        assert_invalid(
            f.at.renew(sid, "held", f.held.fencing_token, ttl).await,
            &format!("Renew of the held lock, {name}"),
        );
        assert_invalid(
            f.at.open_session("o", ttl).await,
            &format!("OpenSession, {name}"),
        );
        f.assert_unharmed(name).await;
    }
    assert_invalid(
        f.at.acquire(
            sid,
            "held",
            LONG_TTL,
            MAX_WAIT_MAX + Duration::from_millis(1),
        )
        .await,
        "Acquire, max_wait above the maximum",
    );
    f.assert_unharmed("max_wait above the maximum").await;
    // The limits themselves are allowed.
    for ttl in [TTL_MIN, TTL_MAX] {
        let grant =
            f.at.try_acquire(sid, &format!("ttl-{}", ttl.as_millis()), ttl)
                .await
                .unwrap_or_else(|e| panic!("ttl {ttl:?} is within the limits: {e}"))
                .expect("granted");
        assert_eq!(grant.ttl_ms, lock_tests::ms(ttl));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_blank_and_oversized_sessions_and_owners_are_rejected() {
    let f = Fixture::new().await;
    let long_session = "s".repeat(SESSION_ID_LEN_MAX + 1);
    for (name, sid) in [
        ("empty session id", ""),
        ("oversized session id", long_session.as_str()),
    ] {
        assert_invalid(
            f.at.acquire(sid, "k", LONG_TTL, Duration::ZERO).await,
            &format!("Acquire, {name}"),
        );
        assert_invalid(f.at.heartbeat(sid).await, &format!("Heartbeat, {name}"));
        assert_invalid(f.at.locks_of(sid).await, &format!("LocksOf, {name}"));
        assert_invalid(
            f.at.close_session(sid).await,
            &format!("CloseSession, {name}"),
        );
    }
    // A well-formed id no server issued: acquiring under it is a caller bug (LockError doc:
    // "an unknown session" is InvalidArgument); heartbeat says the session is gone; closing it
    // releases nothing.
    let unknown = "no-such-session";
    assert_invalid(
        f.at.acquire(unknown, "k", LONG_TTL, Duration::ZERO).await,
        "Acquire, unknown session",
    );
    assert_invalid(
        f.at.try_acquire(unknown, "k", LONG_TTL).await,
        "TryAcquire, unknown session",
    );
    assert_eq!(
        f.at.heartbeat(unknown).await,
        Ok(false),
        "Heartbeat of an unknown session"
    );
    assert_eq!(
        f.at.close_session(unknown).await,
        Ok(0),
        "CloseSession of an unknown session"
    );
    match f.at.locks_of(unknown).await {
        Ok(keys) => assert!(keys.is_empty(), "an unknown session holds {keys:?}"),
        Err(LockError::InvalidArgument { message }) => {
            println!("LocksOf, unknown session: InvalidArgument: {message}")
        }
        other => panic!("LocksOf of an unknown session answered {other:?}"),
    }
    // An unknown session must never take over, renew away or release the held lock.
    match f.at.release(unknown, "held", f.held.fencing_token).await {
        Ok(false) | Err(LockError::InvalidArgument { .. }) => {}
        other => panic!("Release under an unknown session answered {other:?}"),
    }
    f.assert_unharmed("unknown session").await;

    let long_owner = "o".repeat(OWNER_ID_LEN_MAX + 1);
    for (name, owner) in [
        ("empty owner", ""),
        ("blank owner", " \t"),
        ("oversized owner", long_owner.as_str()),
    ] {
        assert_invalid(
            f.at.open_session(owner, LONG_TTL).await,
            &format!("OpenSession, {name}"),
        );
    }
    f.assert_unharmed("bad owners").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_with_the_wrong_token_changes_nothing() {
    let f = Fixture::new().await;
    let sid = f.holder.id.as_str();
    for wrong in [
        f.held.fencing_token + 1,
        f.held.fencing_token + 1000,
        u64::MAX,
    ] {
        assert_eq!(
            f.at.release(sid, "held", wrong).await,
            Ok(false),
            "Release with token {wrong} (held with {})",
            f.held.fencing_token
        );
        f.assert_unharmed(&format!("a release with token {wrong}"))
            .await;
    }
    match f.at.release(sid, "held", 0).await {
        Ok(false) | Err(LockError::InvalidArgument { .. }) => {}
        other => panic!("Release with token 0 answered {other:?}"),
    }
    f.assert_unharmed("a release with token 0").await;
    // A release of a key that was never held is `false`, not an error.
    assert_eq!(
        f.at.release(sid, "never-held", f.held.fencing_token).await,
        Ok(false)
    );
    // The real holder is unaffected: it still renews and releases.
    let renewed =
        f.at.renew(sid, "held", f.held.fencing_token, LONG_TTL)
            .await
            .expect("renew")
            .expect("still held");
    assert_eq!(renewed.fencing_token, f.held.fencing_token);
    assert_eq!(
        f.at.release(sid, "held", f.held.fencing_token).await,
        Ok(true)
    );
}

/// On a TLS cluster (the fixture's) a blank operator is the caller's principal
/// (docs/SECURITY.md §4, t65's audit cases), so "no operator" is tested on an `--insecure`
/// node below; a malformed operator or reason is invalid on both, before any name is compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_without_operator_or_reason_revokes_nothing() {
    let f = Fixture::new().await;
    let long_operator = "o".repeat(OPERATOR_LEN_MAX + 1);
    let long_reason = "r".repeat(REASON_LEN_MAX + 1);
    for (name, operator, reason) in [
        ("empty reason", "oncall", ""),
        ("blank reason", "oncall", " \n "),
        ("oversized operator", long_operator.as_str(), "reason"),
        ("operator with a newline", "on\ncall", "reason"),
        ("oversized reason", "oncall", long_reason.as_str()),
    ] {
        assert_invalid(
            f.at.force_revoke("held", operator, reason).await,
            &format!("ForceRevoke, {name}"),
        );
        f.assert_unharmed(name).await;
    }
}

/// Without authenticated callers (`--insecure`) the request's operator is what the audit log
/// records, so a blank one is refused and revokes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_without_an_operator_on_an_insecure_node_revokes_nothing() {
    let mut cluster = Cluster::start_with(ClusterConfig {
        tls: false,
        ..ClusterConfig::with_nodes(1)
    })
    .await;
    let at = cluster.leader_client().await;
    let holder = at.open_session("holder", LONG_TTL).await.expect("open");
    let held = at
        .try_acquire(&holder.id, "held", LONG_TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    for (name, operator) in [("empty operator", ""), ("blank operator", "  ")] {
        assert_invalid(
            at.force_revoke("held", operator, "reason").await,
            &format!("ForceRevoke, {name}"),
        );
        let info = at.inspect("held", true).await.expect("inspect");
        assert_eq!(
            info.map(|i| i.fencing_token),
            Some(held.fencing_token),
            "{name}: the grant is untouched"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_on_the_grpc_port_leave_the_node_serving() {
    let f = Fixture::new().await;
    let addr = f.cluster.addr(f.leader);
    let endpoint = f.cluster.endpoint(f.leader);

    // 64 KiB of deterministic pseudo-random junk (a 64-bit LCG, so a failure reproduces).
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let junk: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect();
    let http2_preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut preface_then_junk = http2_preface.to_vec();
    preface_then_junk.extend_from_slice(&junk[..4096]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("raw TCP junk", junk.clone()),
        ("HTTP/1 GET", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".to_vec()),
        (
            "HTTP/1 POST to a gRPC method",
            b"POST /lockd.v1.LockService/Acquire HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/grpc\r\ncontent-length: 5\r\n\r\n\0\0\0\0\0".to_vec(),
        ),
        ("HTTP/2 preface then junk frames", preface_then_junk),
        ("a truncated HTTP/2 preface", http2_preface[..10].to_vec()),
    ];
    for (name, bytes) in cases {
        let exchange = send_tcp_bytes(&addr, &bytes, JUNK_READ_FOR)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        println!(
            "{name}: wrote {} of {} bytes, got {} bytes back (first line {:?}), closed by node: {}, error: {:?}",
            exchange.written,
            bytes.len(),
            exchange.received.len(),
            exchange.first_line(),
            exchange.closed_by_node,
            exchange.error
        );
        f.assert_unharmed(name).await;
    }

    // Idle half-open connections must not stop the node from serving others.
    let mut idle = Vec::new();
    for _ in 0..16 {
        let stream = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        idle.push(stream);
    }
    f.assert_unharmed("16 idle connections").await;
    drop(idle);

    // Well-framed gRPC calls whose bodies are not the method's protobuf.
    for (name, path, body) in [
        (
            "junk Acquire body",
            "/lockd.v1.LockService/Acquire",
            junk[..512].to_vec(),
        ),
        (
            "junk Renew body",
            "/lockd.v1.LockService/Renew",
            vec![0xff; 64],
        ),
        (
            "junk OpenSession body",
            "/lockd.v1.SessionService/OpenSession",
            vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        ),
        (
            "junk ForceRevoke body",
            "/lockd.v1.LockService/ForceRevoke",
            vec![0x12, 0x80],
        ),
        (
            "an unknown method",
            "/lockd.v1.LockService/NoSuchMethod",
            Vec::new(),
        ),
    ] {
        match raw_grpc_unary_on(&endpoint, f.cluster.channel(f.leader), path, body).await {
            Err(status) => println!("{name}: {:?} {:?}", status.code(), status.message()),
            Ok(answer) => panic!("{name}: the node answered OK with {} bytes", answer.len()),
        }
        f.assert_unharmed(name).await;
    }
    // An empty body is a valid protobuf (every field default): Acquire with a blank key and
    // session is a caller error, never a grant.
    match raw_grpc_unary_on(
        &endpoint,
        f.cluster.channel(f.leader),
        "/lockd.v1.LockService/Acquire",
        Vec::new(),
    )
    .await
    {
        Err(status) => assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "an all-default Acquire: {status:?}"
        ),
        Ok(answer) => panic!(
            "an all-default Acquire answered OK with {} bytes",
            answer.len()
        ),
    }
    f.assert_unharmed("an all-default Acquire").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_its_wait_limit_is_refused_and_its_queued_waits_survive() {
    /// lockd's bound on one session's queued waits (`WAITS_PER_SESSION_MAX` in the replicated
    /// state machine); the test fills it and asks for one more.
    const WAITS_PER_SESSION_MAX: usize = 32;
    let f = Fixture::new().await;
    let waiter = f.at.open_session("greedy", LONG_TTL).await.expect("open");
    for i in 0..=WAITS_PER_SESSION_MAX {
        f.at.try_acquire(&f.holder.id, &format!("busy-{i}"), LONG_TTL)
            .await
            .expect("try_acquire")
            .expect("granted");
    }
    let mut waits = Vec::new();
    for i in 0..WAITS_PER_SESSION_MAX {
        let at = f.at.clone();
        let session_id = waiter.id.clone();
        waits.push(tokio::spawn(async move {
            at.acquire(
                &session_id,
                &format!("busy-{i}"),
                LONG_TTL,
                Duration::from_secs(25),
            )
            .await
        }));
    }
    lock_tests::poll_until(
        "every allowed wait to be queued",
        Duration::from_secs(15),
        || {
            let at = f.at.clone();
            async move {
                let mut queued = 0;
                for i in 0..WAITS_PER_SESSION_MAX {
                    if let Ok(Some(info)) = at.inspect(&format!("busy-{i}"), true).await {
                        queued += info.waiter_count;
                    }
                }
                if queued as usize == WAITS_PER_SESSION_MAX {
                    Ok(())
                } else {
                    Err(format!("{queued} queued"))
                }
            }
        },
    )
    .await
    .expect("queued");
    let over = format!("busy-{WAITS_PER_SESSION_MAX}");
    assert_invalid(
        f.at.acquire(&waiter.id, &over, LONG_TTL, Duration::from_secs(25))
            .await,
        "one wait over the session's limit",
    );
    // The queued waits are untouched: releasing a key hands it to its waiter.
    let info =
        f.at.inspect("busy-0", true)
            .await
            .expect("inspect")
            .expect("held");
    assert_eq!(info.waiter_count, 1);
    assert!(
        f.at.release(&f.holder.id, "busy-0", info.fencing_token)
            .await
            .expect("release")
    );
    let first = waits.remove(0);
    let grant = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first wait answers")
        .expect("no panic")
        .expect("acquire")
        .expect("granted after the release");
    assert_eq!(grant.session_id, waiter.id);
    f.assert_unharmed("a session over its wait limit").await;
    // Closing the greedy session withdraws the rest of its waits.
    assert_eq!(f.at.close_session(&waiter.id).await, Ok(1));
    for (i, wait) in waits.into_iter().enumerate() {
        let answer = tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("a withdrawn wait answers")
            .expect("no panic");
        match answer {
            Ok(None) | Err(LockError::InvalidArgument { .. }) => {}
            other => panic!("wait {} of a closed session answered {other:?}", i + 1),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_raft_messages_leave_the_cluster_serving() {
    use lock_proto::v1::RaftPayload;
    use lock_proto::v1::raft_service_client::RaftServiceClient;

    let f = Fixture::new().await;
    let mut term_before = Vec::new();
    for id in f.cluster.ids() {
        term_before.push(f.cluster.status(id).await.expect("status").current_term);
    }
    for id in f.cluster.ids() {
        // As a node (the only role the Raft service admits), so the garbage reaches the
        // Raft decoding rather than stopping at authorization.
        let channel = f.cluster.channel_as(id, "node-1");
        let mut raft = RaftServiceClient::new(channel);
        let payloads: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("junk", vec![0xff; 64]),
            ("a huge varint", vec![0xff; 10]),
            ("zeros", vec![0; 4096]),
        ];
        for (name, data) in payloads {
            for method in ["Append", "AppendStream", "Vote", "PreVote", "Snapshot"] {
                let request = RaftPayload { data: data.clone() };
                let one = || tokio_stream::iter(vec![request.clone()]);
                let call = async {
                    let bytes =
                        |answer: tonic::Response<RaftPayload>| answer.into_inner().data.len();
                    match method {
                        "Append" => raft.append(request.clone()).await.map(bytes),
                        "Vote" => raft.vote(request.clone()).await.map(bytes),
                        "PreVote" => raft.pre_vote(request.clone()).await.map(bytes),
                        "Snapshot" => raft.snapshot(one()).await.map(bytes),
                        _ => match raft.append_stream(one()).await {
                            Ok(answers) => answers
                                .into_inner()
                                .message()
                                .await
                                .map(|answer| answer.map_or(0, |a| a.data.len())),
                            Err(status) => Err(status),
                        },
                    }
                };
                match tokio::time::timeout(lock_tests::client::RPC_TIMEOUT, call).await {
                    Ok(Ok(len)) => println!("node {id} {method}({name}): OK with {len} bytes"),
                    Ok(Err(status)) => println!(
                        "node {id} {method}({name}): {:?} {:?}",
                        status.code(),
                        status.message()
                    ),
                    Err(_) => println!("node {id} {method}({name}): no answer"),
                }
            }
        }
        f.assert_unharmed(&format!("junk Raft messages to node {id}"))
            .await;
    }
    let mut term_after = Vec::new();
    for id in f.cluster.ids() {
        term_after.push(f.cluster.status(id).await.expect("status").current_term);
    }
    println!("terms before {term_before:?}, after {term_after:?}");
}

/// The `ErrorDetail` a status carries, read from the raw `grpc-status-details-bin` bytes as any
/// gRPC client in any language would (`google.rpc.Status` → `Any` → `lockd.v1.ErrorDetail`),
/// not through the Rust client's error map.
fn error_detail_of(status: &tonic::Status) -> Option<lock_proto::v1::ErrorDetail> {
    use prost::Message;
    let envelope = lock_proto::v1::RpcStatus::decode(status.details()).ok()?;
    let any = envelope
        .details
        .into_iter()
        .find(|any| any.type_url == lock_proto::error::ERROR_DETAIL_TYPE_URL)?;
    lock_proto::v1::ErrorDetail::decode(any.value.as_slice()).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_decode_is_invalid_argument_with_a_detail_naming_it() {
    use lock_proto::v1::error_detail::Kind;
    let f = Fixture::new().await;
    let endpoint = f.cluster.endpoint(f.leader);
    // Each body is well-framed gRPC whose message is not a valid protobuf of the method's
    // request type. Field 1 of each request below is a string (`session_id`, `key`, ...).
    for (name, path, body, names) in [
        (
            "a string field that is not UTF-8",
            "/lockd.v1.LockService/Acquire",
            vec![0x0a, 0x02, 0xff, 0xfe],
            "AcquireRequest",
        ),
        (
            "a truncated message",
            "/lockd.v1.LockService/Release",
            vec![0x0a, 0x0a, b'x'],
            "ReleaseRequest",
        ),
        (
            "a field of the wrong wire type",
            "/lockd.v1.SessionService/OpenSession",
            vec![0x08, 0x01],
            "OpenSessionRequest",
        ),
    ] {
        let status =
            match raw_grpc_unary_on(&endpoint, f.cluster.channel(f.leader), path, body).await {
                Err(status) => status,
                Ok(answer) => panic!("{name}: answered OK with {} bytes", answer.len()),
            };
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{name}: {status:?}"
        );
        let detail = error_detail_of(&status)
            .unwrap_or_else(|| panic!("{name}: no lockd.v1.ErrorDetail in {status:?}"));
        match detail.kind {
            Some(Kind::InvalidArgument(invalid)) => assert!(
                invalid.message.contains(names),
                "{name}: the detail does not name {names}: {:?}",
                invalid.message
            ),
            other => panic!("{name}: detail is not invalid_argument: {other:?}"),
        }
        f.assert_unharmed(name).await;
    }
}
