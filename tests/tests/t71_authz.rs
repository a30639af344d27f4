//! Authorization through gRPC against real `lockd` processes serving TLS (docs/SECURITY.md
//! §2, §3, §5): what each role may call, an unauthenticated call, a bearer token, and a session
//! refused to a principal other than the one that opened it, with the lock untouched.
//!
//! `AdminService.ListRevocations` (operator) is the audit work's and not on this branch; its
//! refusal is covered by the method table's unit test (`node/src/auth/methods.rs`).

use std::time::Duration;

use lock_api::{LockError, SESSION_OWNER_ROLE};
use lock_proto::error::lock_error_from_status;
use lock_proto::v1::admin_service_client::AdminServiceClient;
use lock_proto::v1::raft_service_client::RaftServiceClient;
use lock_proto::v1::session_service_client::SessionServiceClient;
use lock_proto::v1::{ChangeMembershipRequest, OpenSessionRequest, RaftPayload, StatusRequest};
use lock_tests::dial::Dial;
use lock_tests::{Cluster, ClusterConfig, poll_until};
use tonic::metadata::MetadataValue;

const TTL: Duration = Duration::from_secs(30);

fn denied(principal: &str, role: &str) -> LockError {
    LockError::PermissionDenied {
        principal: principal.to_owned(),
        required_role: role.to_owned(),
    }
}

/// A refused call's error and whether its status carried lockd's `ErrorDetail` (the code
/// alone decodes to the same variant, but with blank fields; the detail is what names the
/// principal and the role).
fn refusal(status: tonic::Status) -> (LockError, bool) {
    (
        lock_error_from_status(&status),
        !status.details().is_empty(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_may_call_what_it_includes_and_no_more() {
    let mut cluster = Cluster::start_with(ClusterConfig {
        nodes: 1,
        ..ClusterConfig::default()
    })
    .await;
    let leader = cluster.leader().await;
    let as_client = cluster.client_as(leader, "client");
    let as_operator = cluster.client_as(leader, "operator");

    // client: sessions and locks yes, ForceRevoke and membership no.
    let session = as_client
        .open_session("authz-client", TTL)
        .await
        .expect("open");
    let grant = as_client
        .try_acquire(&session.id, "authz/roles", TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    assert_eq!(
        as_client
            .force_revoke("authz/roles", "client", "drill")
            .await
            .unwrap_err(),
        denied("client", "operator")
    );
    let members = ChangeMembershipRequest {
        voter_ids: vec![leader],
        retain: false,
    };
    let status = AdminServiceClient::new(cluster.channel_as(leader, "client"))
        .change_membership(members.clone())
        .await
        .expect_err("a client may not change the membership");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(refusal(status), (denied("client", "admin"), true));
    // The Raft service is the nodes' only, whatever else a principal may do.
    let status = RaftServiceClient::new(cluster.channel_as(leader, "admin"))
        .vote(RaftPayload::default())
        .await
        .expect_err("an admin may not vote");
    assert_eq!(refusal(status), (denied("admin", "node"), true));
    // A principal the CA signed but no role names may call nothing but health.
    cluster.pki().mint("stranger");
    let status = AdminServiceClient::new(cluster.channel_as(leader, "stranger"))
        .status(StatusRequest {})
        .await
        .expect_err("no role, no status");
    assert_eq!(refusal(status), (denied("stranger", "client"), true));

    // operator: may revoke (and so displace the client's grant).
    let revoked = as_operator
        .force_revoke("authz/roles", "operator", "drill")
        .await
        .expect("an operator may revoke");
    assert_eq!(revoked.previous_token, grant.fencing_token);
    let status = AdminServiceClient::new(cluster.channel_as(leader, "operator"))
        .change_membership(members.clone())
        .await
        .expect_err("an operator may not change the membership");
    assert_eq!(refusal(status), (denied("operator", "admin"), true));

    // admin: may change the membership (to what it is: a one-voter cluster stays one).
    AdminServiceClient::new(cluster.channel_as(leader, "admin"))
        .change_membership(members)
        .await
        .expect("an admin may change the membership");
    assert_eq!(cluster.leader().await, leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_credentials_is_unauthenticated_and_a_bearer_token_authenticates() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let tokens = dir.path().join("tokens");
    let token = "s3cret-token-of-billing-batch";
    std::fs::write(
        &tokens,
        format!(
            "# the billing team's batch job\nbilling-batch {}\n",
            lockd::auth::tokens::hash_line(token)
        ),
    )
    .expect("write the tokens file");
    let mut cluster = Cluster::start_with(ClusterConfig {
        nodes: 1,
        require_client_cert: false,
        roles: vec![("billing-batch".into(), "client".into())],
        extra_args: vec!["--tokens-file".into(), tokens.display().to_string()],
        ..ClusterConfig::default()
    })
    .await;
    let leader = cluster.leader().await;
    let anonymous = Dial::tls_anonymous(cluster.pki()).channel(&cluster.addr(leader));
    let open = |token: Option<&str>| {
        let mut request = tonic::Request::new(OpenSessionRequest {
            owner_id: "billing".into(),
            ttl_ms: 30_000,
        });
        if let Some(token) = token {
            let value: MetadataValue<_> = format!("Bearer {token}").parse().expect("ascii");
            request.metadata_mut().insert("authorization", value);
        }
        request
    };
    let mut sessions = SessionServiceClient::new(anonymous);

    for (what, token) in [("no token", None), ("a wrong token", Some("guess"))] {
        let status = sessions.open_session(open(token)).await.expect_err(what);
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{what}");
        let (err, detailed) = refusal(status);
        assert!(detailed, "{what}: the refusal carries the ErrorDetail");
        assert!(
            matches!(err, LockError::Unauthenticated { .. }),
            "{what}: {err:?}"
        );
        assert!(
            !err.to_string().contains("guess"),
            "the token is never echoed: {err}"
        );
    }

    let opened = sessions
        .open_session(open(Some(token)))
        .await
        .expect("the token authenticates billing-batch")
        .into_inner();
    // The session is billing-batch's: a certificate principal may not use it.
    let hijack = cluster
        .client_as(leader, "client")
        .heartbeat(&opened.session_id)
        .await;
    assert_eq!(hijack.unwrap_err(), denied("client", SESSION_OWNER_ROLE));
}

/// A second principal presenting the first one's session id is refused for every call that
/// takes one, and the first one's lock is untouched (the full list runs on every backend in
/// `conformance_grpc::principals`; here over a Pipeline stream and a leader failover too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_principal_cannot_use_the_first_ones_session_even_after_a_failover() {
    use lock_proto::v1::lock_service_client::LockServiceClient;
    use lock_proto::v1::pipeline_request::Call;
    use lock_proto::v1::pipeline_response::Answer;
    use lock_proto::v1::{PipelineRequest, ReleaseRequest};

    let mut cluster = Cluster::start_with(ClusterConfig {
        nodes: 3,
        roles: vec![("client-2".into(), "client".into())],
        ..ClusterConfig::default()
    })
    .await;
    cluster.pki().mint("client-2");
    let leader = cluster.leader().await;
    let first = cluster.client_as(leader, "client");
    let session = first.open_session("authz-first", TTL).await.expect("open");
    let grant = first
        .try_acquire(&session.id, "authz/hijack", TTL)
        .await
        .expect("try_acquire")
        .expect("granted");
    let second = cluster.client_as(leader, "client-2");
    let refused = denied("client-2", SESSION_OWNER_ROLE);
    assert_eq!(second.heartbeat(&session.id).await.unwrap_err(), refused);
    assert_eq!(
        second
            .release(&session.id, "authz/hijack", grant.fencing_token)
            .await
            .unwrap_err(),
        refused
    );
    assert_eq!(
        second.close_session(&session.id).await.unwrap_err(),
        refused
    );

    // Over a Pipeline stream: the stream's caller is the second principal's for every call.
    let call = PipelineRequest {
        call_id: 1,
        timeout_ms: 10_000,
        call: Some(Call::Release(ReleaseRequest {
            session_id: session.id.clone(),
            request_id: 77,
            key: "authz/hijack".into(),
            fencing_token: grant.fencing_token,
        })),
    };
    let mut answers = LockServiceClient::new(cluster.channel_as(leader, "client-2"))
        .pipeline(tokio_stream::iter([call]))
        .await
        .expect("the stream opens")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("the stream answers")
        .expect("one answer");
    match answer.answer {
        Some(Answer::Error(detail)) => {
            assert_eq!(lock_proto::error::lock_error_from_detail(detail), refused)
        }
        other => panic!("the pipelined release answered {other:?}"),
    }

    // Fail over: the new leader refuses the same way.
    cluster.kill(leader);
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    let second = cluster.client_as(new_leader, "client-2");
    // The new leader answers `Contention` (retry-safe) while it restarts leases; the answer
    // under test is the first one after that.
    let renewed = past_contention("the new leader's answer to the renew", || {
        second.renew(&session.id, "authz/hijack", grant.fencing_token, TTL)
    })
    .await;
    assert_eq!(renewed.unwrap_err(), refused);
    let released = past_contention("the new leader's answer to the release", || {
        second.release(&session.id, "authz/hijack", grant.fencing_token)
    })
    .await;
    assert_eq!(released.unwrap_err(), refused);

    let first = cluster.client_as(new_leader, "client");
    let info = cluster
        .client(new_leader)
        .inspect("authz/hijack", true)
        .await
        .expect("inspect")
        .expect("still held");
    assert_eq!(
        (info.session_id.as_str(), info.fencing_token),
        (session.id.as_str(), grant.fencing_token)
    );
    let renewed = first
        .renew(&session.id, "authz/hijack", grant.fencing_token, TTL)
        .await
        .expect("the owner renews at the new leader");
    assert_eq!(renewed.map(|g| g.fencing_token), Some(grant.fencing_token));
}

/// lockctl as `client` asking for a revoke: one plain line naming the principal and the role,
/// exit 1 (the cluster refused), and no retrying until `--timeout` (it answers at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockctl_reports_a_refusal_in_plain_words_and_exits_non_zero() {
    let mut cluster = Cluster::start_with(ClusterConfig {
        nodes: 1,
        ..ClusterConfig::default()
    })
    .await;
    let leader = cluster.leader().await;
    let (ca, cert, key) = cluster.sdk_tls("client");
    let started = std::time::Instant::now();
    let mut command = tokio::process::Command::new(lockctl_binary());
    command
        .args(["--endpoints", &cluster.addr(leader), "--timeout", "20s"])
        .args(["revoke", "--key", "authz/lockctl", "--operator", "client"])
        .args(["--reason", "drill"])
        .env_remove("LOCKD_ENDPOINTS")
        .env_remove("LOCKD_TOKEN")
        .env("LOCKD_CA", ca)
        .env("LOCKD_CERT", cert)
        .env("LOCKD_KEY", key)
        .kill_on_drop(true);
    let output = command.output().await.expect("run lockctl");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr
            .contains(r#"permission denied: principal "client" does not have the role "operator""#),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "answered at once, not retried to the timeout: {:?}",
        started.elapsed()
    );
}

/// The `lockctl` binary next to the test executable (`cargo build -p lock-client`), or
/// `$LOCKCTL_BIN`.
fn lockctl_binary() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("LOCKCTL_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let candidate = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("lockctl"))
        .expect("the test executable lives in target/<profile>/deps");
    assert!(
        candidate.is_file(),
        "lockctl not found at {}; build it with `cargo build -p lock-client` or set LOCKCTL_BIN",
        candidate.display()
    );
    candidate
}

/// The first answer of `call` that is not `Contention`, retried while it is (a leader restarting
/// its leases answers so), for at most a minute.
async fn past_contention<T, F, Fut>(what: &str, mut call: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    let answer = poll_until(what, Duration::from_secs(60), || {
        let answer = call();
        async move {
            match answer.await {
                Err(LockError::Contention { message }) => Err(message),
                settled => Ok(settled),
            }
        }
    })
    .await;
    answer.unwrap_or_else(|e| panic!("{e}"))
}
