//! The SDK against fake in-process lockd nodes (tonic servers on 127.0.0.1:0): leader
//! discovery by `NotLeader` hints, skipping a dead endpoint, idempotent retries, the deadline
//! rule, heartbeats, keep-alive, listeners, cancellation and the guard. The fakes answer from a
//! script, so each behaviour of the client is tested without the real node.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_api::{LockError, LockHandle, LockService};
use lock_client::{ClientConfig, LockClient, SafetyMargin};
use lock_proto::error::status_from_lock_error;
use lock_proto::v1;
use tonic::{Request, Response, Status};

/// How long a test waits for a condition before it fails.
const WAIT_MAX: Duration = Duration::from_secs(10);

/// Polls `condition` every 10 ms until it holds or [`WAIT_MAX`] passes (then panics naming
/// `what`).
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_MAX;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What a fake node does; tests change it while it runs.
#[derive(Debug, Default)]
struct Script {
    /// `Some(hint)`: a follower answering every client call `NotLeader` with this hint.
    follower_hint: Option<Option<String>>,
    /// Whether Status names a leader (`leader_addr`), so discovery can find it.
    status_names: Option<String>,
    /// Answer this many Acquire/TryAcquire calls with `Contention` before granting.
    acquire_failures: u32,
    /// Hold Acquire this long before answering.
    acquire_delay: Duration,
    /// Acquire answers "not granted" (after `acquire_delay`).
    acquire_refuses: bool,
    /// Renew answers "lost".
    renew_lost: bool,
    /// Renew answers `Contention`.
    renew_fails: bool,
    /// Hold Renew this long before answering.
    renew_delay: Duration,
    /// Heartbeat answers `alive = false`.
    heartbeat_dead: bool,
    /// Heartbeats of these sessions (unary or batched) answer `alive = false`.
    dead_sessions: Vec<String>,
    /// HeartbeatBatch answers `Unimplemented`, like a server older than the call.
    batch_unimplemented: bool,
    /// Pipeline answers `Unimplemented`, like a server older than the call.
    pipeline_unimplemented: bool,
    /// A Pipeline stream ends after this many calls, like a node restarting.
    pipeline_calls_per_stream: Option<u32>,
}

/// What a fake node saw.
#[derive(Debug, Default)]
struct Seen {
    calls: Vec<String>,
    acquire_request_ids: Vec<u64>,
    /// `max_wait_ms` of each blocking Acquire attempt.
    acquire_waits_ms: Vec<u64>,
    cancels: Vec<(String, u64, String)>,
    releases: Vec<(String, u64)>,
    renews: u32,
    heartbeats: u32,
    /// The session ids of each HeartbeatBatch call, in arrival order.
    batches: Vec<Vec<String>>,
    /// The owner of the last session opened (sessions are "s1", "s2", ... in opening order).
    owner: String,
    /// Pipeline streams asked for (served or refused).
    pipelines: u32,
    /// Lock calls that arrived on a Pipeline stream.
    piped_calls: u32,
    /// Pipeline streams whose client closed its side.
    pipelines_closed: u32,
}

#[derive(Clone, Default)]
struct Fake {
    script: Arc<Mutex<Script>>,
    seen: Arc<Mutex<Seen>>,
    tokens: Arc<AtomicU64>,
    sessions: Arc<AtomicU64>,
}

impl Fake {
    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().expect("script lock")
    }
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().expect("seen lock")
    }
    fn note(&self, call: &str) -> Result<(), Status> {
        self.seen().calls.push(call.to_owned());
        match &self.script().follower_hint {
            Some(hint) => Err(status_from_lock_error(&LockError::NotLeader {
                leader_id: hint.as_ref().map(|_| 2),
                leader_addr: hint.clone(),
            })),
            None => Ok(()),
        }
    }
    /// The scripted answer to a heartbeat of `session_id`.
    fn heartbeat_answer(&self, session_id: &str) -> v1::HeartbeatResponse {
        let alive = {
            let script = self.script();
            !script.heartbeat_dead && !script.dead_sessions.iter().any(|d| d == session_id)
        };
        v1::HeartbeatResponse {
            alive,
            ttl_ms: if alive {
                SESSION_TTL.as_millis() as u64
            } else {
                0
            },
        }
    }
    fn grant(&self, session_id: &str, key: &str, ttl_ms: u64, token: u64) -> v1::Grant {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        v1::Grant {
            key: key.to_owned(),
            owner_id: self.seen().owner.clone(),
            session_id: session_id.to_owned(),
            fencing_token: token,
            ttl_ms,
            server_expiry_unix_ms: now_ms + ttl_ms,
        }
    }
}

#[tonic::async_trait]
impl v1::admin_service_server::AdminService for Fake {
    async fn status(
        &self,
        _: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let leader = self.script().status_names.clone();
        Ok(Response::new(v1::StatusResponse {
            node_id: 1,
            role: v1::Role::Follower as i32,
            leader_id: leader.as_ref().map(|_| 2),
            leader_addr: leader.unwrap_or_default(),
            ..Default::default()
        }))
    }
    async fn init(
        &self,
        _: Request<v1::InitRequest>,
    ) -> Result<Response<v1::InitResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn add_learner(
        &self,
        _: Request<v1::AddLearnerRequest>,
    ) -> Result<Response<v1::AddLearnerResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn change_membership(
        &self,
        _: Request<v1::ChangeMembershipRequest>,
    ) -> Result<Response<v1::ChangeMembershipResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn list_revocations(
        &self,
        _: Request<v1::ListRevocationsRequest>,
    ) -> Result<Response<v1::ListRevocationsResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

#[tonic::async_trait]
impl v1::session_service_server::SessionService for Fake {
    async fn open_session(
        &self,
        request: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::OpenSessionResponse>, Status> {
        self.note("open_session")?;
        let request = request.into_inner();
        self.seen().owner = request.owner_id;
        let n = self.sessions.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Response::new(v1::OpenSessionResponse {
            session_id: format!("s{n}"),
            ttl_ms: request.ttl_ms,
        }))
    }
    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        self.note("heartbeat")?;
        self.seen().heartbeats += 1;
        Ok(Response::new(
            self.heartbeat_answer(&request.into_inner().session_id),
        ))
    }
    async fn heartbeat_batch(
        &self,
        request: Request<v1::HeartbeatBatchRequest>,
    ) -> Result<Response<v1::HeartbeatBatchResponse>, Status> {
        self.note("heartbeat_batch")?;
        if self.script().batch_unimplemented {
            return Err(Status::unimplemented("fake: no HeartbeatBatch"));
        }
        let ids = request.into_inner().session_ids;
        {
            let mut seen = self.seen();
            seen.heartbeats += ids.len() as u32;
            seen.batches.push(ids.clone());
        }
        let results = ids
            .iter()
            .map(|id| v1::HeartbeatBatchResult {
                outcome: Some(v1::heartbeat_batch_result::Outcome::Heartbeat(
                    self.heartbeat_answer(id),
                )),
            })
            .collect();
        Ok(Response::new(v1::HeartbeatBatchResponse { results }))
    }
    async fn close_session(
        &self,
        _: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        self.note("close_session")?;
        Ok(Response::new(v1::CloseSessionResponse {
            locks_released: 0,
        }))
    }
    async fn locks_of(
        &self,
        _: Request<v1::LocksOfRequest>,
    ) -> Result<Response<v1::LocksOfResponse>, Status> {
        self.note("locks_of")?;
        Ok(Response::new(v1::LocksOfResponse { keys: vec![] }))
    }
}

impl Fake {
    async fn acquire_answer(
        &self,
        session_id: String,
        request_id: u64,
        key: String,
        ttl_ms: u64,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.seen().acquire_request_ids.push(request_id);
        let (fail, delay, refuse) = {
            let mut script = self.script();
            let fail = script.acquire_failures > 0;
            if fail {
                script.acquire_failures -= 1;
            }
            (fail, script.acquire_delay, script.acquire_refuses)
        };
        if fail {
            return Err(status_from_lock_error(&LockError::contention(
                "scripted failure",
            )));
        }
        tokio::time::sleep(delay).await;
        if refuse {
            return Ok(Response::new(v1::AcquireResponse { grant: None }));
        }
        let token = self.tokens.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Response::new(v1::AcquireResponse {
            grant: Some(self.grant(&session_id, &key, ttl_ms, token)),
        }))
    }
}

#[tonic::async_trait]
impl v1::lock_service_server::LockService for Fake {
    async fn acquire(
        &self,
        request: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.note("acquire")?;
        let r = request.into_inner();
        self.seen().acquire_waits_ms.push(r.max_wait_ms);
        self.acquire_answer(r.session_id, r.request_id, r.key, r.ttl_ms)
            .await
    }
    async fn try_acquire(
        &self,
        request: Request<v1::TryAcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.note("try_acquire")?;
        let r = request.into_inner();
        self.acquire_answer(r.session_id, r.request_id, r.key, r.ttl_ms)
            .await
    }
    async fn cancel_acquire(
        &self,
        request: Request<v1::CancelAcquireRequest>,
    ) -> Result<Response<v1::CancelAcquireResponse>, Status> {
        self.note("cancel_acquire")?;
        let r = request.into_inner();
        self.seen()
            .cancels
            .push((r.session_id, r.request_id, r.key));
        Ok(Response::new(v1::CancelAcquireResponse {
            released_grant: false,
        }))
    }
    async fn renew(
        &self,
        request: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        self.note("renew")?;
        let r = request.into_inner();
        self.seen().renews += 1;
        let (lost, fails, delay) = {
            let s = self.script();
            (s.renew_lost, s.renew_fails, s.renew_delay)
        };
        tokio::time::sleep(delay).await;
        if fails {
            return Err(status_from_lock_error(&LockError::contention(
                "scripted renew failure",
            )));
        }
        let grant = (!lost).then(|| self.grant(&r.session_id, &r.key, r.ttl_ms, r.fencing_token));
        Ok(Response::new(v1::RenewResponse { grant }))
    }
    async fn release(
        &self,
        request: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        self.note("release")?;
        let r = request.into_inner();
        self.seen().releases.push((r.key, r.fencing_token));
        Ok(Response::new(v1::ReleaseResponse { released: true }))
    }
    async fn inspect(
        &self,
        _: Request<v1::InspectRequest>,
    ) -> Result<Response<v1::InspectResponse>, Status> {
        self.note("inspect")?;
        Ok(Response::new(v1::InspectResponse { info: None }))
    }
    async fn force_revoke(
        &self,
        _: Request<v1::ForceRevokeRequest>,
    ) -> Result<Response<v1::ForceRevokeResponse>, Status> {
        self.note("force_revoke")?;
        Err(Status::unimplemented("fake"))
    }

    type PipelineStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<v1::PipelineResponse, Status>> + Send>,
    >;

    /// Runs each call through the unary method of the same name, concurrently, like lockd.
    async fn pipeline(
        &self,
        request: Request<tonic::Streaming<v1::PipelineRequest>>,
    ) -> Result<Response<Self::PipelineStream>, Status> {
        self.seen().pipelines += 1;
        if self.script().pipeline_unimplemented {
            return Err(Status::unimplemented("Pipeline"));
        }
        let mut incoming = request.into_inner();
        let (answers, out) = tokio::sync::mpsc::channel(64);
        let fake = self.clone();
        let limit = self.script().pipeline_calls_per_stream;
        tokio::spawn(async move {
            let mut taken = 0;
            while let Ok(Some(call)) = incoming.message().await {
                fake.seen().piped_calls += 1;
                let (fake, answers) = (fake.clone(), answers.clone());
                tokio::spawn(async move {
                    let _ = answers.send(Ok(fake.piped(call).await)).await;
                });
                taken += 1;
                if limit == Some(taken) {
                    // The stream ends once the calls taken are answered.
                    return;
                }
            }
            fake.seen().pipelines_closed += 1;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }
}

impl Fake {
    /// One Pipeline call, answered by the unary method of the same name.
    async fn piped(&self, request: v1::PipelineRequest) -> v1::PipelineResponse {
        use v1::lock_service_server::LockService as _;
        use v1::pipeline_request::Call;
        use v1::pipeline_response::Answer;
        fn answer<M>(r: Result<Response<M>, Status>, ok: fn(M) -> Answer) -> Answer {
            match r {
                Ok(m) => ok(m.into_inner()),
                Err(status) => Answer::Error(lock_proto::error::error_detail_from_lock_error(
                    &lock_proto::error::lock_error_from_status(&status),
                )),
            }
        }
        let answer = match request.call.expect("a call") {
            Call::Acquire(r) => answer(self.acquire(Request::new(r)).await, Answer::Acquire),
            Call::TryAcquire(r) => answer(self.try_acquire(Request::new(r)).await, Answer::Acquire),
            Call::CancelAcquire(r) => answer(
                self.cancel_acquire(Request::new(r)).await,
                Answer::CancelAcquire,
            ),
            Call::Renew(r) => answer(self.renew(Request::new(r)).await, Answer::Renew),
            Call::Release(r) => answer(self.release(Request::new(r)).await, Answer::Release),
        };
        v1::PipelineResponse {
            call_id: request.call_id,
            answer: Some(answer),
        }
    }
}

/// Starts `fake` on 127.0.0.1:0 and returns its address.
async fn serve(fake: Fake) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(v1::admin_service_server::AdminServiceServer::new(
                fake.clone(),
            ))
            .add_service(v1::session_service_server::SessionServiceServer::new(
                fake.clone(),
            ))
            .add_service(v1::lock_service_server::LockServiceServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("fake server");
    });
    addr
}

/// An address nothing listens on (bound, then closed).
async fn dead_addr() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    listener.local_addr().expect("addr")
}

/// Session TTL of the tests: heartbeats every second, with room for a loaded machine.
const SESSION_TTL: Duration = Duration::from_secs(3);

fn config() -> ClientConfig {
    ClientConfig {
        call_timeout: Duration::from_secs(3),
        attempt_timeout: Duration::from_secs(1),
        session_ttl: SESSION_TTL,
        safety_margin: SafetyMargin::Fixed(Duration::from_millis(100)),
        jitter_seed: Some(7),
        ..ClientConfig::default()
    }
}

async fn leader_and_client() -> (Fake, LockClient) {
    let leader = Fake::default();
    let addr = serve(leader.clone()).await;
    let client = LockClient::connect_with(&[addr.to_string()], config())
        .await
        .expect("connect");
    (leader, client)
}

const TTL: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_not_leader_hint_is_followed_to_a_leader_the_client_was_not_given() {
    let leader = Fake::default();
    let leader_addr = serve(leader.clone()).await;
    let follower = Fake::default();
    follower.script().follower_hint = Some(Some(leader_addr.to_string()));
    let follower_addr = serve(follower.clone()).await;

    let client = LockClient::connect_with(&[follower_addr.to_string()], config())
        .await
        .expect("connect");
    let session = client.open_session("owner").await.expect("open session");
    assert_eq!(session.session_id(), "s1");
    assert_eq!(
        client.endpoints(),
        vec![follower_addr.to_string(), leader_addr.to_string()]
    );
    assert_eq!(client.believed_leader(), leader_addr.to_string());
    assert_eq!(follower.seen().calls, vec!["open_session"]);
    assert_eq!(leader.seen().calls, vec!["open_session"]);
    session.close().await.expect("close");
}

#[tokio::test]
async fn a_dead_endpoint_and_a_hintless_follower_are_skipped() {
    let leader = Fake::default();
    let leader_addr = serve(leader.clone()).await;
    let follower = Fake::default();
    follower.script().follower_hint = Some(None);
    let follower_addr = serve(follower.clone()).await;
    let dead = dead_addr().await;

    let client = LockClient::connect_with(
        &[
            dead.to_string(),
            follower_addr.to_string(),
            leader_addr.to_string(),
        ],
        config(),
    )
    .await
    .expect("connect");
    let session = client.open_session("owner").await.expect("open session");
    assert_eq!(client.believed_leader(), leader_addr.to_string());
    assert_eq!(follower.seen().calls, vec!["open_session"]);
    drop(session);
}

#[tokio::test]
async fn a_follower_naming_itself_leader_is_skipped() {
    let leader = Fake::default();
    let leader_addr = serve(leader.clone()).await;
    let stale = Fake::default();
    let stale_addr = serve(stale.clone()).await;
    stale.script().follower_hint = Some(Some(stale_addr.to_string()));

    let client =
        LockClient::connect_with(&[stale_addr.to_string(), leader_addr.to_string()], config())
            .await
            .expect("connect");
    client.open_session("owner").await.expect("open session");
    assert_eq!(client.believed_leader(), leader_addr.to_string());
    assert_eq!(stale.seen().calls, vec!["open_session"]);
}

#[tokio::test]
async fn no_reachable_endpoint_is_a_contention_error_naming_it() {
    let dead = dead_addr().await;
    match LockClient::connect_with(&[dead.to_string()], config()).await {
        Err(LockError::Contention { message }) => {
            assert!(message.contains(&dead.to_string()), "{message}")
        }
        other => panic!("expected Contention, got {other:?}"),
    }
}

#[tokio::test]
async fn a_retried_acquire_reuses_its_request_id() {
    let (leader, client) = leader_and_client().await;
    leader.script().acquire_failures = 2;
    let session = client.open_session("owner").await.expect("session");
    let handle = session
        .acquire("k", TTL, Duration::from_secs(1))
        .await
        .expect("acquire")
        .expect("granted");
    assert_eq!(handle.fencing_token, 1);
    let ids = leader.seen().acquire_request_ids.clone();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    // Each retry waits only for what is left of max_wait.
    let waits = leader.seen().acquire_waits_ms.clone();
    assert_eq!(waits[0], 1_000, "{waits:?}");
    assert!(waits.windows(2).all(|w| w[1] < w[0]), "{waits:?}");
    // The next logical call carries a new id.
    session.try_acquire("k2", TTL).await.expect("try");
    let ids = leader.seen().acquire_request_ids.clone();
    assert!(ids[3] > ids[0], "{ids:?}");
}

#[tokio::test]
async fn lock_calls_share_one_pipeline_stream() {
    let (leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    for key in ["a", "b", "c"] {
        let handle = session
            .acquire(key, TTL, Duration::from_secs(1))
            .await
            .expect("acquire")
            .expect("granted");
        assert!(session.renew(&handle).await.expect("renew").is_some());
        assert!(session.release(&handle).await.expect("release"));
    }
    let seen = leader.seen();
    assert_eq!(seen.pipelines, 1, "one stream for every call");
    assert_eq!(
        seen.piped_calls, 9,
        "acquire, renew and release of three keys"
    );
    assert_eq!(seen.releases.len(), 3);
}

#[tokio::test]
async fn a_pipeline_stream_that_ends_is_reopened_and_no_call_is_lost() {
    let (leader, client) = leader_and_client().await;
    leader.script().pipeline_calls_per_stream = Some(2);
    let session = client.open_session("owner").await.expect("session");
    for key in ["a", "b", "c"] {
        let handle = session
            .acquire(key, TTL, Duration::from_secs(1))
            .await
            .expect("acquire")
            .expect("granted");
        assert!(session.release(&handle).await.expect("release"));
    }
    let seen = leader.seen();
    assert!(
        seen.pipelines >= 3,
        "six calls, two per stream: {}",
        seen.pipelines
    );
    assert_eq!(seen.releases.len(), 3);
}

#[tokio::test]
async fn dropping_a_pipeline_closes_its_stream() {
    let leader = Fake::default();
    let addr = serve(leader.clone()).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_lazy();
    let pipeline = lock_client::pipeline::Pipeline::new(channel);
    let release = v1::ReleaseRequest {
        session_id: "s1".into(),
        request_id: 1,
        key: "k".into(),
        fencing_token: 1,
    };
    let answer = pipeline
        .release(release, Duration::from_secs(5))
        .await
        .expect("release");
    assert!(answer.into_inner().released);
    assert_eq!(leader.seen().pipelines, 1);
    assert_eq!(
        leader.seen().pipelines_closed,
        0,
        "open while the pipeline lives"
    );
    drop(pipeline);
    wait_for("the server to see the stream closed", || {
        leader.seen().pipelines_closed == 1
    })
    .await;
}

#[tokio::test]
async fn a_server_without_pipeline_gets_unary_lock_calls_and_is_asked_once() {
    let (leader, client) = leader_and_client().await;
    leader.script().pipeline_unimplemented = true;
    let session = client.open_session("owner").await.expect("session");
    for key in ["a", "b"] {
        let handle = session
            .acquire(key, TTL, Duration::from_secs(1))
            .await
            .expect("acquire")
            .expect("granted");
        assert!(session.release(&handle).await.expect("release"));
    }
    let seen = leader.seen();
    assert_eq!(seen.pipelines, 1, "asked once, then unary");
    assert_eq!(seen.piped_calls, 0);
    assert_eq!(
        seen.calls.iter().filter(|c| *c == "acquire").count(),
        2,
        "{:?}",
        seen.calls
    );
    assert_eq!(seen.releases.len(), 2);
}

#[tokio::test]
async fn the_deadline_counts_from_before_the_send_minus_the_margin() {
    let (leader, client) = leader_and_client().await;
    leader.script().acquire_delay = Duration::from_millis(300);
    let session = client.open_session("owner").await.expect("session");
    let before = Instant::now();
    let handle = session
        .acquire("k", TTL, Duration::from_secs(1))
        .await
        .expect("acquire")
        .expect("granted");
    let after = Instant::now();
    assert!(after - before >= Duration::from_millis(300));
    // ttl 2 s - margin 100 ms, counted from the send (just after `before`)...
    let from_before = handle.client_deadline - before;
    assert!(
        from_before >= Duration::from_millis(1_900),
        "{from_before:?}"
    );
    // ...not from the answer, which came at least the server's 300 ms later.
    let lease_counted = TTL - Duration::from_millis(100);
    assert!(handle.client_deadline + Duration::from_millis(300) <= after + lease_counted);
}

#[tokio::test]
async fn a_spent_retry_budget_is_contention_and_never_lock_lost() {
    let (leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    let handle = session
        .try_acquire("k", Duration::from_secs(10))
        .await
        .expect("try")
        .expect("granted");
    leader.script().renew_fails = true;
    match session.renew(&handle).await {
        Err(LockError::Contention { message }) => assert!(message.contains("renew"), "{message}"),
        other => panic!("expected Contention, got {other:?}"),
    }
    assert!(leader.seen().renews > 1, "the renewal was not retried");
    assert_eq!(session.check_still_held(&handle), Ok(()));
}

#[tokio::test]
async fn a_dead_session_fires_the_listeners_of_every_handle() {
    let (leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    let lost: Arc<Mutex<Vec<LockHandle>>> = Arc::default();
    let sink = Arc::clone(&lost);
    session.on_lock_lost(|_| panic!("a panicking listener must not stop the others"));
    // A listener that blocks until the test ends must not delay the others either.
    let (unblock, blocked) = std::sync::mpsc::channel::<()>();
    let blocked = Mutex::new(blocked);
    session.on_lock_lost(move |_| {
        let _ = blocked.lock().expect("blocked").recv();
    });
    session.on_lock_lost(move |h| sink.lock().expect("lost").push(h.clone()));
    let a = session
        .try_acquire("a", Duration::from_secs(30))
        .await
        .expect("a")
        .expect("a granted");
    let b = session
        .try_acquire("b", Duration::from_secs(30))
        .await
        .expect("b")
        .expect("b granted");
    leader.script().heartbeat_dead = true;
    wait_for("both listeners", || lost.lock().expect("lost").len() == 2).await;
    let mut keys: Vec<String> = lost
        .lock()
        .expect("lost")
        .iter()
        .map(|h| h.key.clone())
        .collect();
    keys.sort();
    assert_eq!(keys, vec!["a", "b"]);
    drop(unblock);
    assert!(!session.is_alive());
    assert_eq!(
        session.check_still_held(&a),
        Err(LockError::LockLost { key: "a".into() })
    );
    assert!(matches!(
        session.renew(&b).await,
        Err(LockError::LockLost { .. })
    ));
}

#[tokio::test]
async fn the_sessions_of_one_client_heartbeat_together_in_batches() {
    let (leader, client) = leader_and_client().await;
    // Opened 100 ms apart, so they are due at different instants; each is within a quarter of
    // the heartbeat interval of the first, so the first round carries all three.
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(client.open_session("owner").await.expect("session"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the sessions' TTL (3 s): only the batches can have kept them alive.
    wait_for("four heartbeat batches", || {
        leader.seen().batches.len() >= 4
    })
    .await;
    let seen = leader.seen();
    let mut first = seen.batches[0].clone();
    first.sort();
    assert_eq!(
        first,
        vec!["s1", "s2", "s3"],
        "one batch for every session due"
    );
    assert!(
        seen.batches.iter().all(|b| b.len() == 3),
        "the sessions stay together: {:?}",
        seen.batches
    );
    assert!(
        !seen.calls.iter().any(|c| c == "heartbeat"),
        "no unary heartbeat: {:?}",
        seen.calls
    );
    drop(seen);
    assert!(sessions.iter().all(|s| s.is_alive()));
}

#[tokio::test]
async fn a_session_answered_dead_in_a_batch_dies_alone() {
    let (leader, client) = leader_and_client().await;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(client.open_session("owner").await.expect("session"));
    }
    let doomed = sessions
        .iter()
        .position(|s| s.session_id() == "s2")
        .expect("s2");
    let handle = sessions[doomed]
        .try_acquire("k", Duration::from_secs(30))
        .await
        .expect("acquire")
        .expect("granted");
    let lost: Arc<Mutex<Vec<LockHandle>>> = Arc::default();
    let sink = Arc::clone(&lost);
    sessions[doomed].on_lock_lost(move |h| sink.lock().expect("lost").push(h.clone()));
    leader.script().dead_sessions = vec!["s2".into()];
    wait_for("the listener of s2's grant", || {
        !lost.lock().expect("lost").is_empty()
    })
    .await;
    assert!(!sessions[doomed].is_alive());
    assert_eq!(
        sessions[doomed].check_still_held(&handle),
        Err(LockError::LockLost { key: "k".into() })
    );
    // The two others keep being heartbeated in batches, past their TTL.
    let batches_then = leader.seen().batches.len();
    wait_for("three more heartbeat batches", || {
        leader.seen().batches.len() >= batches_then + 3
    })
    .await;
    let last = leader.seen().batches.last().cloned().expect("a batch");
    assert_eq!(
        last.len(),
        2,
        "the dead session left the schedule: {last:?}"
    );
    assert!(!last.contains(&"s2".to_owned()));
    for (i, session) in sessions.iter().enumerate() {
        assert_eq!(session.is_alive(), i != doomed, "{}", session.session_id());
    }
}

#[tokio::test]
async fn a_server_without_heartbeat_batch_gets_unary_heartbeats() {
    let (leader, client) = leader_and_client().await;
    leader.script().batch_unimplemented = true;
    let a = client.open_session("owner").await.expect("a");
    let b = client.open_session("owner").await.expect("b");
    // Past the TTL (3 s): unary heartbeats must have kept both alive.
    wait_for("eight unary heartbeats", || leader.seen().heartbeats >= 8).await;
    let calls = leader.seen().calls.clone();
    assert_eq!(
        calls.iter().filter(|c| *c == "heartbeat_batch").count(),
        1,
        "asked once, then unary only: {calls:?}"
    );
    assert!(leader.seen().batches.is_empty());
    assert!(a.is_alive() && b.is_alive());
}

#[tokio::test]
async fn keep_alive_carries_a_handle_past_its_first_deadline() {
    let (leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    let handle = session
        .try_acquire("k", Duration::from_secs(1))
        .await
        .expect("try")
        .expect("granted");
    session.keep_alive(&handle).expect("keep alive");
    wait_for("the first deadline to pass", || {
        Instant::now() > handle.client_deadline + Duration::from_millis(200)
    })
    .await;
    assert!(
        leader.seen().renews >= 2,
        "renews: {}",
        leader.seen().renews
    );
    assert_eq!(session.check_still_held(&handle), Ok(()));
    let latest = session.latest(&handle).expect("latest");
    assert!(latest.client_deadline > handle.client_deadline);
    assert_eq!(latest.fencing_token, handle.fencing_token);
    // Released: keep-alive stops and no listener fires.
    assert_eq!(session.release(&handle).await, Ok(true));
    let renews = leader.seen().renews;
    wait_for("a renewal interval", || {
        Instant::now() > latest.client_deadline + Duration::from_millis(100)
    })
    .await;
    assert_eq!(leader.seen().renews, renews);
}

#[tokio::test]
async fn a_renewal_answered_lost_is_terminal_and_fires_the_listener() {
    let (leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    let fired = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&fired);
    session.on_lock_lost(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    });
    let handle = session
        .try_acquire("k", Duration::from_secs(30))
        .await
        .expect("try")
        .expect("granted");
    leader.script().renew_lost = true;
    assert_eq!(session.renew(&handle).await, Ok(None));
    wait_for("the listener", || fired.load(Ordering::SeqCst) == 1).await;
    assert_eq!(
        session.check_still_held(&handle),
        Err(LockError::LockLost { key: "k".into() })
    );
    assert!(matches!(
        session.keep_alive(&handle),
        Err(LockError::LockLost { .. })
    ));
}

#[tokio::test]
async fn the_local_deadline_alone_fires_the_listener() {
    let (_leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    let fired = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&fired);
    session.on_lock_lost(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    });
    let handle = session
        .try_acquire("k", Duration::from_secs(1))
        .await
        .expect("try")
        .expect("granted");
    wait_for("the listener", || fired.load(Ordering::SeqCst) == 1).await;
    assert!(Instant::now() >= handle.client_deadline);
    assert!(session.check_still_held(&handle).is_err());
}

#[tokio::test]
async fn dropping_a_waiting_acquire_cancels_it_on_the_server() {
    let (leader, client) = leader_and_client().await;
    leader.script().acquire_delay = Duration::from_secs(30);
    let session = client.open_session("owner").await.expect("session");
    let waiting = session.acquire("k", TTL, Duration::from_secs(20));
    let dropped = tokio::time::timeout(Duration::from_millis(200), waiting).await;
    assert!(
        dropped.is_err(),
        "the acquire should still have been waiting"
    );
    wait_for("the cancellation", || !leader.seen().cancels.is_empty()).await;
    let request_id = leader.seen().acquire_request_ids[0];
    assert_eq!(
        leader.seen().cancels,
        vec![("s1".to_owned(), request_id, "k".to_owned())]
    );
}

#[tokio::test]
async fn a_long_wait_is_followed_by_a_renewal_that_rebases_the_deadline() {
    let (leader, client) = leader_and_client().await;
    // 1.2 s of a 2 s lease (1.9 s after the margin) go by in the wait.
    leader.script().acquire_delay = Duration::from_millis(1_200);
    let session = client.open_session("owner").await.expect("session");
    let before = Instant::now();
    let handle = session
        .acquire("k", TTL, Duration::from_secs(5))
        .await
        .expect("acquire")
        .expect("granted");
    assert_eq!(leader.seen().renews, 1, "no re-basing renewal");
    // Counted from the renewal's send (after the 1.2 s wait), not from the acquire's.
    assert!(handle.client_deadline >= before + Duration::from_millis(1_200 + 1_900));
}

#[tokio::test]
async fn dropping_an_acquire_after_its_grant_releases_the_grant() {
    let (leader, client) = leader_and_client().await;
    leader.script().acquire_delay = Duration::from_millis(1_200);
    leader.script().renew_delay = Duration::from_secs(30);
    let session = client.open_session("owner").await.expect("session");
    // Dropped while the re-basing renewal hangs: the grant (token 1) is already recorded.
    let acquiring = session.acquire("k", TTL, Duration::from_secs(5));
    let dropped = tokio::time::timeout(Duration::from_millis(1_600), acquiring).await;
    assert!(
        dropped.is_err(),
        "the acquire should still have been renewing"
    );
    wait_for("the release of the recorded grant", || {
        !leader.seen().releases.is_empty()
    })
    .await;
    assert_eq!(leader.seen().releases, vec![("k".to_owned(), 1)]);
    assert_eq!(leader.seen().cancels.len(), 1);
}

#[tokio::test]
async fn a_refused_acquire_is_none_and_cancels_nothing() {
    let (leader, client) = leader_and_client().await;
    leader.script().acquire_refuses = true;
    let session = client.open_session("owner").await.expect("session");
    assert_eq!(
        session.acquire("k", TTL, Duration::from_millis(50)).await,
        Ok(None)
    );
    assert!(leader.seen().cancels.is_empty());
}

#[tokio::test]
async fn a_dropped_guard_releases_its_grant() {
    let (leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    let handle = session
        .try_acquire("k", TTL)
        .await
        .expect("try")
        .expect("granted");
    let token = handle.fencing_token;
    let guard = session.guard(handle);
    assert_eq!(guard.fencing_token(), token);
    drop(guard);
    wait_for("the release", || !leader.seen().releases.is_empty()).await;
    assert_eq!(leader.seen().releases, vec![("k".to_owned(), token)]);
}

#[tokio::test]
async fn arguments_are_checked_before_anything_is_sent() {
    let (leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    let calls = leader.seen().calls.len();
    for result in [
        session.try_acquire(" ", TTL).await,
        LockService::try_acquire(&session, "k", "someone-else", TTL).await,
        session.try_acquire("k", Duration::from_millis(10)).await,
        session.acquire("k", TTL, Duration::from_secs(3600)).await,
    ] {
        assert!(
            matches!(result, Err(LockError::InvalidArgument { .. })),
            "{result:?}"
        );
    }
    assert_eq!(leader.seen().calls.len(), calls);
}

#[tokio::test]
async fn the_session_acquires_for_its_own_owner_and_the_trait_checks_it() {
    let (_leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    // The session's own acquire names no owner: the grant is the session's owner's.
    let own = session
        .try_acquire("k", TTL)
        .await
        .expect("try")
        .expect("granted");
    assert_eq!(own.owner_id, session.owner_id());
    assert_eq!(session.release(&own).await, Ok(true));
    // Code generic over `LockService` names the owner; the session's own one is accepted.
    let generic = LockService::acquire(&session, "k2", "owner", TTL, Duration::from_secs(1))
        .await
        .expect("acquire")
        .expect("granted");
    assert_eq!(generic.owner_id, "owner");
    assert_eq!(LockService::release(&session, &generic).await, Ok(true));
}

/// Runs `lockctl` against `addr` with `args` and returns (exit code, stdout, stderr).
async fn lockctl(addr: SocketAddr, args: &[&str]) -> (Option<i32>, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("--endpoints")
        .arg(addr.to_string())
        .args(args)
        .env_remove("LOCKD_ENDPOINTS")
        .output()
        .await
        .expect("run lockctl");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn lockctl_exec_passes_the_lock_to_the_command_and_its_status_back() {
    let leader = Fake::default();
    let addr = serve(leader.clone()).await;
    let script = r#"test "$LOCK_KEY" = job && test "$LOCK_FENCING_TOKEN" = 1 && test "$LOCK_OWNER" = me && exit 7"#;
    let (code, _, stderr) = lockctl(
        addr,
        &[
            "exec", "--key", "job", "--owner", "me", "--ttl", "2s", "--", "sh", "-c", script,
        ],
    )
    .await;
    assert_eq!(code, Some(7), "stderr: {stderr}");
    // The lock was released after the command ended.
    assert_eq!(leader.seen().releases, vec![("job".to_owned(), 1)]);
}

#[tokio::test]
async fn lockctl_exec_kills_the_command_when_the_lock_is_lost() {
    let leader = Fake::default();
    leader.script().renew_lost = true;
    let addr = serve(leader.clone()).await;
    let started = Instant::now();
    let (code, _, stderr) = lockctl(
        addr,
        &["exec", "--key", "job", "--ttl", "1s", "--", "sleep", "30"],
    )
    .await;
    assert_eq!(code, Some(4), "stderr: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
}

#[tokio::test]
async fn lockctl_try_prints_the_handle_as_json() {
    let leader = Fake::default();
    let addr = serve(leader.clone()).await;
    let (code, stdout, stderr) =
        lockctl(addr, &["try", "--key", "k", "--owner", "me", "--ttl", "5s"]).await;
    assert_eq!(code, Some(0), "stderr: {stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).expect("json");
    assert_eq!(json["key"], "k");
    assert_eq!(json["fencing_token"], 1);
    assert_eq!(json["session_id"], "s1");
    assert_eq!(json["ttl_ms"], 5000);
    // Detached: the session was not closed, so the lock outlives the command.
    assert!(!leader.seen().calls.contains(&"close_session".to_owned()));

    leader.script().acquire_refuses = true;
    let (code, _, stderr) = lockctl(addr, &["try", "--key", "k"]).await;
    assert_eq!(code, Some(3), "stderr: {stderr}");
}

/// The counters a thread-local `metrics` recorder saw since the last call, by name (a
/// snapshot drains them). `#[tokio::test]` runs every task of a test on its one thread, so a
/// recorder set for that thread sees exactly that test's events, each emitted in the same
/// synchronous step that changed the state the test then observes.
fn counters(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<(String, u64)> {
    let mut counters: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => {
                Some((key.key().name().to_owned(), n))
            }
            _ => None,
        })
        .collect();
    counters.sort();
    counters
}

#[tokio::test]
async fn a_passed_local_deadline_counts_one_lease_expired() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (_leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    let handle = session
        .try_acquire("k", Duration::from_secs(1))
        .await
        .expect("try")
        .expect("granted");
    wait_for("the deadline to pass", || {
        Instant::now() >= handle.client_deadline
    })
    .await;
    // Noticed by the watchdog or by this check, whichever is first; counted once.
    assert!(session.check_still_held(&handle).is_err());
    assert!(session.check_still_held(&handle).is_err());
    assert_eq!(
        counters(&snapshotter),
        vec![(lock_client::events::LEASE_EXPIRED_COUNTER.to_owned(), 1)]
    );
    assert!(
        session.is_alive(),
        "a lease expiring locally is not a lost session"
    );
}

#[tokio::test]
async fn a_session_answered_dead_counts_one_session_lost_and_no_lease_expired() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (leader, client) = leader_and_client().await;
    let session = client.open_session("owner").await.expect("session");
    session
        .try_acquire("a", Duration::from_secs(30))
        .await
        .expect("a")
        .expect("a granted");
    leader.script().heartbeat_dead = true;
    wait_for("the session to die", || !session.is_alive()).await;
    assert_eq!(
        counters(&snapshotter),
        vec![(lock_client::events::SESSION_LOST_COUNTER.to_owned(), 1)],
        "its grant is lost with it, not expired"
    );
}

#[tokio::test]
async fn a_fence_rejection_counts_one_fenced_out_and_an_admission_none() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut fence = lock_client::Fence::new("payout");
    lock_client::events::admit(&mut fence, 7).expect("a newer token is admitted");
    assert!(counters(&snapshotter).is_empty());
    assert_eq!(
        lock_client::events::admit(&mut fence, 5),
        Err(LockError::FencedOut {
            key: "payout".into(),
            presented: 5,
            stored: 7
        })
    );
    assert_eq!(
        counters(&snapshotter),
        vec![(lock_client::events::FENCED_OUT_COUNTER.to_owned(), 1)]
    );
    assert_eq!(fence.stored(), 7, "admit answers what Fence::admit answers");
}
