//! Thin, typed helpers over lockd's raw gRPC clients, for tests.
//!
//! [`NodeClient`] talks to one node and returns exactly what that node answered, as
//! `Result<_, LockError>` (errors decoded only by [`lock_proto::lock_error_from_status`]).
//! [`ClusterClient`] follows the leader: it retries `NotLeader` at the hinted node and
//! `Contention` (including an unreachable node) at the next one, until a deadline, keeping the
//! request id of a mutating call so the retry is idempotent (docs/DESIGN.md D-idempotency).
//!
//! These helpers add no lock semantics of their own: no client deadlines, no heartbeats, no
//! background tasks. That is the SDK's (`lock-client`) job, which is tested separately.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_api::LockError;
use lock_proto::lock_error_from_status;
use lock_proto::v1::admin_service_client::AdminServiceClient;
use lock_proto::v1::lock_service_client::LockServiceClient;
use lock_proto::v1::session_service_client::SessionServiceClient;
use lock_proto::v1::{
    AcquireRequest, CancelAcquireRequest, CloseSessionRequest, ForceRevokeRequest, Grant,
    HeartbeatRequest, InspectRequest, LockInfo, LockOutcome, LocksOfRequest, OpenSessionRequest,
    ReleaseRequest, RenewRequest, StatusRequest, StatusResponse, TryAcquireRequest,
};
use tonic::transport::Channel;

use crate::dial::{Dial, strip_scheme};

/// How long a single call may go unanswered before the helper gives up with
/// [`LockError::Contention`] (an unknown outcome). A blocking acquire gets its `max_wait` on
/// top. Bounded so a paused (SIGSTOP) or black-holed node cannot hang a test.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(3);

/// How long connecting to a node may take. Nodes are local, so anything slower means the node
/// is down or paused.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long [`ClusterClient`] keeps retrying by default: several election timeouts, so one
/// failover fits.
pub const RETRY_FOR: Duration = Duration::from_secs(10);

/// Pause before retrying after `Contention` or a `NotLeader` without a usable hint (an election
/// in flight): short against an election timeout, long enough not to flood a busy node.
pub const RETRY_BACKOFF: Duration = Duration::from_millis(50);

static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh request id, unique in this test process (so unique within every session). A retry of
/// one request must reuse its id; the `*_with_request_id` methods take one explicitly.
pub fn next_request_id() -> u64 {
    NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed)
}

/// Milliseconds of a duration, as the wire carries them (saturating; tests never pass ages).
pub fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An open session as `OpenSession` answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The session id the server chose.
    pub id: String,
    /// The owner the session was opened for.
    pub owner_id: String,
    /// The TTL the server granted.
    pub ttl: Duration,
}

/// Runs one gRPC call with a client-side timeout, decoding a failure into a [`LockError`].
async fn call<T>(
    what: &str,
    endpoint: &str,
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(lock_error_from_status(&status)),
        Err(_) => Err(LockError::contention(format!(
            "{what} at {endpoint}: no answer within {timeout:?} (outcome unknown)"
        ))),
    }
}

/// The raw gRPC clients of one node, with typed helpers. Cheap to clone (the channel is
/// shared); connects lazily, so building one for a dead node succeeds and its calls fail with
/// [`LockError::Contention`].
#[derive(Clone, Debug)]
pub struct NodeClient {
    endpoint: String,
    lock: LockServiceClient<Channel>,
    session: SessionServiceClient<Channel>,
    admin: AdminServiceClient<Channel>,
}

impl NodeClient {
    /// A plaintext client of the node at `endpoint` (`http://host:port`), for nodes run with
    /// `--insecure`; [`NodeClient::dial`] for TLS.
    ///
    /// # Panics
    /// If `endpoint` is not a valid URI (a harness bug: the harness builds them).
    pub fn new(endpoint: &str) -> Self {
        Self::dial(endpoint, &Dial::Plain)
    }

    /// A client of the node at `addr` (`host:port`, or an endpoint URI whose scheme `dial`
    /// replaces), connecting as `dial` says.
    ///
    /// # Panics
    /// As [`NodeClient::new`].
    pub fn dial(addr: &str, dial: &Dial) -> Self {
        let addr = strip_scheme(addr);
        Self::over(&dial.endpoint(addr), dial.channel(addr))
    }

    /// A client over an existing `channel` to the node at `endpoint` (used in messages only).
    pub fn over(endpoint: &str, channel: Channel) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            lock: LockServiceClient::new(channel.clone()),
            session: SessionServiceClient::new(channel.clone()),
            admin: AdminServiceClient::new(channel),
        }
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The raw `LockService` client, for requests the helpers do not cover.
    pub fn lock_service(&self) -> LockServiceClient<Channel> {
        self.lock.clone()
    }

    /// The raw `SessionService` client.
    pub fn session_service(&self) -> SessionServiceClient<Channel> {
        self.session.clone()
    }

    /// The raw `AdminService` client.
    pub fn admin_service(&self) -> AdminServiceClient<Channel> {
        self.admin.clone()
    }

    /// `AdminService.Status`: this node's view of the cluster.
    pub async fn status(&self) -> Result<StatusResponse, LockError> {
        let mut admin = self.admin.clone();
        call(
            "Status",
            &self.endpoint,
            RPC_TIMEOUT,
            admin.status(StatusRequest {}),
        )
        .await
    }

    /// `OpenSession` for `owner_id` with `ttl`.
    pub async fn open_session(&self, owner_id: &str, ttl: Duration) -> Result<Session, LockError> {
        let mut session = self.session.clone();
        let request = OpenSessionRequest {
            owner_id: owner_id.to_owned(),
            ttl_ms: ms(ttl),
        };
        let answer = call(
            "OpenSession",
            &self.endpoint,
            RPC_TIMEOUT,
            session.open_session(request),
        )
        .await?;
        Ok(Session {
            id: answer.session_id,
            owner_id: owner_id.to_owned(),
            ttl: Duration::from_millis(answer.ttl_ms),
        })
    }

    /// `Heartbeat`: `true` if the session is alive (its TTL restarted), `false` if it is gone
    /// (terminal).
    pub async fn heartbeat(&self, session_id: &str) -> Result<bool, LockError> {
        let mut session = self.session.clone();
        let request = HeartbeatRequest {
            session_id: session_id.to_owned(),
        };
        let answer = call(
            "Heartbeat",
            &self.endpoint,
            RPC_TIMEOUT,
            session.heartbeat(request),
        )
        .await?;
        Ok(answer.alive)
    }

    /// `CloseSession`: how many grants closing released.
    pub async fn close_session(&self, session_id: &str) -> Result<u32, LockError> {
        let mut session = self.session.clone();
        let request = CloseSessionRequest {
            session_id: session_id.to_owned(),
        };
        let answer = call(
            "CloseSession",
            &self.endpoint,
            RPC_TIMEOUT,
            session.close_session(request),
        )
        .await?;
        Ok(answer.locks_released)
    }

    /// `LocksOf`: the keys the session holds, sorted (the server's order is unspecified).
    pub async fn locks_of(&self, session_id: &str) -> Result<Vec<String>, LockError> {
        let mut session = self.session.clone();
        let request = LocksOfRequest {
            session_id: session_id.to_owned(),
        };
        let mut keys = call(
            "LocksOf",
            &self.endpoint,
            RPC_TIMEOUT,
            session.locks_of(request),
        )
        .await?
        .keys;
        keys.sort();
        Ok(keys)
    }

    /// Blocking `Acquire` with a fresh request id: the grant, or `None` if `max_wait` passed
    /// while someone else held the key.
    pub async fn acquire(
        &self,
        session_id: &str,
        key: &str,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.acquire_with_request_id(session_id, next_request_id(), key, ttl, max_wait)
            .await
    }

    /// Blocking `Acquire` with the given request id (for retries and `CancelAcquire`).
    pub async fn acquire_with_request_id(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let mut lock = self.lock.clone();
        let request = AcquireRequest {
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            ttl_ms: ms(ttl),
            max_wait_ms: ms(max_wait),
        };
        let answer = call(
            "Acquire",
            &self.endpoint,
            RPC_TIMEOUT.saturating_add(max_wait),
            lock.acquire(request),
        )
        .await?;
        Ok(answer.grant)
    }

    /// `TryAcquire` with a fresh request id: the grant, or `None` if the key is held.
    pub async fn try_acquire(
        &self,
        session_id: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.try_acquire_with_request_id(session_id, next_request_id(), key, ttl)
            .await
    }

    /// `TryAcquire` with the given request id.
    pub async fn try_acquire_with_request_id(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let mut lock = self.lock.clone();
        let request = TryAcquireRequest {
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            ttl_ms: ms(ttl),
        };
        let answer = call(
            "TryAcquire",
            &self.endpoint,
            RPC_TIMEOUT,
            lock.try_acquire(request),
        )
        .await?;
        Ok(answer.grant)
    }

    /// `CancelAcquire` of the waiting acquire `(session_id, request_id, key)`: `true` if it had
    /// been granted and the grant was released.
    pub async fn cancel_acquire(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<bool, LockError> {
        let mut lock = self.lock.clone();
        let request = CancelAcquireRequest {
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
        };
        let answer = call(
            "CancelAcquire",
            &self.endpoint,
            RPC_TIMEOUT,
            lock.cancel_acquire(request),
        )
        .await?;
        Ok(answer.released_grant)
    }

    /// `Renew` with a fresh request id: the renewed grant, or `None` = LOST NOW.
    pub async fn renew(
        &self,
        session_id: &str,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.renew_with_request_id(session_id, next_request_id(), key, fencing_token, ttl)
            .await
    }

    /// `Renew` with the given request id.
    pub async fn renew_with_request_id(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let mut lock = self.lock.clone();
        let request = RenewRequest {
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            fencing_token,
            ttl_ms: ms(ttl),
        };
        let answer = call("Renew", &self.endpoint, RPC_TIMEOUT, lock.renew(request)).await?;
        Ok(answer.grant)
    }

    /// `Release` with a fresh request id: `true` if this grant was the one removed.
    pub async fn release(
        &self,
        session_id: &str,
        key: &str,
        fencing_token: u64,
    ) -> Result<bool, LockError> {
        self.release_with_request_id(session_id, next_request_id(), key, fencing_token)
            .await
    }

    /// `Release` with the given request id.
    pub async fn release_with_request_id(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        fencing_token: u64,
    ) -> Result<bool, LockError> {
        let mut lock = self.lock.clone();
        let request = ReleaseRequest {
            session_id: session_id.to_owned(),
            request_id,
            key: key.to_owned(),
            fencing_token,
        };
        let answer = call(
            "Release",
            &self.endpoint,
            RPC_TIMEOUT,
            lock.release(request),
        )
        .await?;
        Ok(answer.released)
    }

    /// `Inspect`: the key's current grant, or `None` if unheld. With `leader_confirmed` only
    /// the leader answers, after a quorum round; without, this node answers from its state.
    pub async fn inspect(
        &self,
        key: &str,
        leader_confirmed: bool,
    ) -> Result<Option<LockInfo>, LockError> {
        let mut lock = self.lock.clone();
        let request = InspectRequest {
            key: key.to_owned(),
            leader_confirmed,
        };
        let answer = call(
            "Inspect",
            &self.endpoint,
            RPC_TIMEOUT,
            lock.inspect(request),
        )
        .await?;
        Ok(answer.info)
    }

    /// `ForceRevoke` with a fresh request id.
    pub async fn force_revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        self.force_revoke_with_request_id(key, operator, reason, next_request_id())
            .await
    }

    /// `ForceRevoke` with the given request id.
    ///
    /// # Panics
    /// If the server answers without an outcome (a protocol violation, so the test fails).
    pub async fn force_revoke_with_request_id(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> Result<LockOutcome, LockError> {
        let mut lock = self.lock.clone();
        let request = ForceRevokeRequest {
            key: key.to_owned(),
            operator: operator.to_owned(),
            reason: reason.to_owned(),
            request_id,
        };
        let answer = call(
            "ForceRevoke",
            &self.endpoint,
            RPC_TIMEOUT,
            lock.force_revoke(request),
        )
        .await?;
        Ok(answer.outcome.unwrap_or_else(|| {
            panic!(
                "protocol violation: {} answered ForceRevoke({key:?}) without an outcome",
                self.endpoint
            )
        }))
    }
}

/// One node as [`ClusterClient`] knows it.
#[derive(Debug)]
struct Member {
    id: u64,
    /// `host:port`, as a `NotLeader` hint names it.
    addr: String,
    client: NodeClient,
}

/// A leader-following client over every node of a cluster: each call goes to the node it last
/// found to be the leader; `NotLeader` moves it to the hinted leader, `Contention` (a busy or
/// unreachable node, an election in flight) to the next node after [`RETRY_BACKOFF`]. It
/// retries for [`ClusterClient::retry_for`] and then returns the last error. Any other error
/// (`InvalidArgument`, `LockLost`, `FencedOut`) is returned at once.
///
/// Mutating helpers pick their request id once and reuse it on every retry, so a call whose
/// first answer was lost is never applied twice. Cheap to clone; clones share the leader guess.
#[derive(Clone, Debug)]
pub struct ClusterClient {
    members: Arc<Vec<Member>>,
    current: Arc<AtomicUsize>,
    retry_for: Duration,
}

impl ClusterClient {
    /// A plaintext client over the nodes `(id, "host:port")`, for nodes run with `--insecure`;
    /// [`ClusterClient::with_dial`] for TLS.
    ///
    /// # Panics
    /// If `nodes` is empty.
    pub fn new(nodes: impl IntoIterator<Item = (u64, String)>) -> Self {
        Self::with_dial(nodes, &Dial::Plain)
    }

    /// A client over the nodes `(id, "host:port")`, connecting to each as `dial` says.
    ///
    /// # Panics
    /// If `nodes` is empty.
    pub fn with_dial(nodes: impl IntoIterator<Item = (u64, String)>, dial: &Dial) -> Self {
        let members: Vec<Member> = nodes
            .into_iter()
            .map(|(id, addr)| Member {
                id,
                client: NodeClient::dial(&addr, dial),
                addr,
            })
            .collect();
        assert!(
            !members.is_empty(),
            "a ClusterClient needs at least one node"
        );
        Self {
            members: Arc::new(members),
            current: Arc::new(AtomicUsize::new(0)),
            retry_for: RETRY_FOR,
        }
    }

    /// The same client (sharing the leader guess) retrying for `retry_for` instead.
    pub fn with_retry_for(&self, retry_for: Duration) -> Self {
        Self {
            retry_for,
            ..self.clone()
        }
    }

    /// How long a call keeps retrying.
    pub fn retry_for(&self) -> Duration {
        self.retry_for
    }

    /// The id of the node the next call goes to first (the last known leader).
    pub fn current_node(&self) -> u64 {
        self.members[self.current.load(Ordering::Relaxed) % self.members.len()].id
    }

    /// Runs `op` against the presumed leader, retrying as described on [`ClusterClient`]
    /// until it succeeds, fails with a non-retryable error, or `retry_for` has passed. `op`
    /// must reuse one request id across its invocations if it mutates.
    pub async fn call<T, F, Fut>(&self, mut op: F) -> Result<T, LockError>
    where
        F: FnMut(NodeClient) -> Fut,
        Fut: Future<Output = Result<T, LockError>>,
    {
        let deadline = Instant::now() + self.retry_for;
        let n = self.members.len();
        loop {
            let at = self.current.load(Ordering::Relaxed) % n;
            let err = match op(self.members[at].client.clone()).await {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            let hinted = match &err {
                LockError::NotLeader {
                    leader_addr: Some(addr),
                    ..
                } => self.members.iter().position(|m| &m.addr == addr),
                LockError::NotLeader { .. } | LockError::Contention { .. } => None,
                _ => return Err(err),
            };
            if Instant::now() >= deadline {
                return Err(err);
            }
            match hinted {
                Some(next) if next != at => {
                    let _ = self.current.compare_exchange(
                        at,
                        next,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
                _ => {
                    let _ = self.current.compare_exchange(
                        at,
                        (at + 1) % n,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    tokio::time::sleep(RETRY_BACKOFF).await;
                }
            }
        }
    }

    /// [`NodeClient::open_session`] at the leader. (A retry after a lost answer may open a
    /// second session; the first one simply expires.)
    pub async fn open_session(&self, owner_id: &str, ttl: Duration) -> Result<Session, LockError> {
        self.call(|c| async move { c.open_session(owner_id, ttl).await })
            .await
    }

    /// [`NodeClient::heartbeat`] at the leader.
    pub async fn heartbeat(&self, session_id: &str) -> Result<bool, LockError> {
        self.call(|c| async move { c.heartbeat(session_id).await })
            .await
    }

    /// [`NodeClient::close_session`] at the leader.
    pub async fn close_session(&self, session_id: &str) -> Result<u32, LockError> {
        self.call(|c| async move { c.close_session(session_id).await })
            .await
    }

    /// [`NodeClient::locks_of`] at the leader.
    pub async fn locks_of(&self, session_id: &str) -> Result<Vec<String>, LockError> {
        self.call(|c| async move { c.locks_of(session_id).await })
            .await
    }

    /// [`NodeClient::acquire`] at the leader, one request id for all retries.
    pub async fn acquire(
        &self,
        session_id: &str,
        key: &str,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.acquire_with_request_id(session_id, next_request_id(), key, ttl, max_wait)
            .await
    }

    /// [`NodeClient::acquire_with_request_id`] at the leader.
    pub async fn acquire_with_request_id(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
        max_wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.call(|c| async move {
            c.acquire_with_request_id(session_id, request_id, key, ttl, max_wait)
                .await
        })
        .await
    }

    /// [`NodeClient::try_acquire`] at the leader, one request id for all retries.
    pub async fn try_acquire(
        &self,
        session_id: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.try_acquire_with_request_id(session_id, next_request_id(), key, ttl)
            .await
    }

    /// [`NodeClient::try_acquire_with_request_id`] at the leader.
    pub async fn try_acquire_with_request_id(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.call(|c| async move {
            c.try_acquire_with_request_id(session_id, request_id, key, ttl)
                .await
        })
        .await
    }

    /// [`NodeClient::cancel_acquire`] at the leader.
    pub async fn cancel_acquire(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
    ) -> Result<bool, LockError> {
        self.call(|c| async move { c.cancel_acquire(session_id, request_id, key).await })
            .await
    }

    /// [`NodeClient::renew`] at the leader, one request id for all retries.
    pub async fn renew(
        &self,
        session_id: &str,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.renew_with_request_id(session_id, next_request_id(), key, fencing_token, ttl)
            .await
    }

    /// [`NodeClient::renew_with_request_id`] at the leader.
    pub async fn renew_with_request_id(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        fencing_token: u64,
        ttl: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.call(|c| async move {
            c.renew_with_request_id(session_id, request_id, key, fencing_token, ttl)
                .await
        })
        .await
    }

    /// [`NodeClient::release`] at the leader, one request id for all retries.
    pub async fn release(
        &self,
        session_id: &str,
        key: &str,
        fencing_token: u64,
    ) -> Result<bool, LockError> {
        self.release_with_request_id(session_id, next_request_id(), key, fencing_token)
            .await
    }

    /// [`NodeClient::release_with_request_id`] at the leader.
    pub async fn release_with_request_id(
        &self,
        session_id: &str,
        request_id: u64,
        key: &str,
        fencing_token: u64,
    ) -> Result<bool, LockError> {
        self.call(|c| async move {
            c.release_with_request_id(session_id, request_id, key, fencing_token)
                .await
        })
        .await
    }

    /// [`NodeClient::inspect`]: with `leader_confirmed` at the leader, else at whichever node
    /// this client currently talks to (a possibly stale follower read).
    pub async fn inspect(
        &self,
        key: &str,
        leader_confirmed: bool,
    ) -> Result<Option<LockInfo>, LockError> {
        self.call(|c| async move { c.inspect(key, leader_confirmed).await })
            .await
    }

    /// [`NodeClient::inspect`] with `leader_confirmed` set, at the leader.
    pub async fn inspect_confirmed(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.inspect(key, true).await
    }

    /// [`NodeClient::force_revoke`] at the leader, one request id for all retries.
    pub async fn force_revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        self.force_revoke_with_request_id(key, operator, reason, next_request_id())
            .await
    }

    /// [`NodeClient::force_revoke_with_request_id`] at the leader.
    pub async fn force_revoke_with_request_id(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
        request_id: u64,
    ) -> Result<LockOutcome, LockError> {
        self.call(|c| async move {
            c.force_revoke_with_request_id(key, operator, reason, request_id)
                .await
        })
        .await
    }
}
