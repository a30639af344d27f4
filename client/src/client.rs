//! [`LockClient`]: the entry point. Connects to a cluster, opens sessions, and makes the calls
//! that need no session (inspect, force-revoke, status) and the by-id calls a command-line tool
//! needs for a session another process opened.
//!
//! Owns the proto ↔ `lock-api` conversions of those calls. It holds no per-session state; that
//! is [`crate::LockClientSession`]'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use lock_api::{LockError, LockHandle, LockInfo, LockOutcome, RevocationRecord, validate};
use lock_proto::v1;
use serde::Serialize;

use crate::config::ClientConfig;
use crate::deadline::{check_margin, handle_from_grant, system_time_from_unix_ms, unix_ms};
use crate::heartbeat::Heartbeats;
use crate::router::{Budget, Router};
use crate::session::LockClientSession;

/// A handle on a lockd cluster. Cheap to clone (clones share the endpoint list, the believed
/// leader and the connections); thread-safe.
///
/// It finds the leader itself: it follows `NotLeader` hints, moves to another endpoint when one
/// is down, and re-resolves when the leader changes, with bounded, jittered exponential backoff
/// (FR-28) within each call's budget ([`ClientConfig::call_timeout`]). Transport failures and
/// leader changes reach the caller only once that budget is spent, and then as `Contention` or
/// `NotLeader` — never as `LockLost`.
#[derive(Clone, Debug)]
pub struct LockClient {
    router: Arc<Router>,
    /// Request ids of force-revokes (which have no session): random start, then a counter, so
    /// that two clients are unlikely to share one and a retry reuses its own.
    revoke_ids: Arc<AtomicU64>,
    /// The heartbeat schedule of every session opened through this client or its clones.
    heartbeats: Arc<Heartbeats>,
}

/// One page of the force-revoke audit log ([`LockClient::list_revocations`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevocationPage {
    /// The records, newest first (highest `new_token_floor` first).
    pub revocations: Vec<RevocationRecord>,
    /// Pass it back to read the next page; `None` when this page is the last. Opaque: it is
    /// valid only with the same `key` filter.
    pub next_page_token: Option<String>,
}

/// One node's answer to `lockctl status` / [`LockClient::cluster_status`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    /// The endpoint that was asked.
    pub endpoint: String,
    /// Its view, or why it did not answer (the error's text).
    #[serde(flatten)]
    pub view: NodeView,
}

/// What one node reports, or the error it answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum NodeView {
    /// The node answered.
    Up(NodeReport),
    /// The node did not answer; the text says why.
    Down {
        /// The failure.
        error: String,
    },
}

/// A node's view of the Raft cluster (AdminService.Status).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeReport {
    /// The node's id.
    pub node_id: u64,
    /// `leader`, `follower`, `candidate`, `learner`, `shutdown` or `unspecified`.
    pub role: String,
    /// The highest Raft term the node has seen.
    pub term: u64,
    /// The leader it knows of; `None` during an election.
    pub leader_id: Option<u64>,
    /// That leader's address; `None` when unknown.
    pub leader_addr: Option<String>,
    /// Highest committed log index.
    pub commit_index: u64,
    /// Highest applied log index.
    pub applied_index: u64,
    /// Highest log index in its log.
    pub last_log_index: u64,
    /// The membership it knows.
    pub members: Vec<ClusterMember>,
    /// The cluster's id; empty before initialisation.
    pub cluster_id: String,
}

/// One member of the cluster membership.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterMember {
    /// Raft node id.
    pub node_id: u64,
    /// gRPC address, `host:port`.
    pub addr: String,
    /// `true` for a voter, `false` for a learner.
    pub voter: bool,
}

fn role_name(role: i32) -> &'static str {
    match v1::Role::try_from(role) {
        Ok(v1::Role::Leader) => "leader",
        Ok(v1::Role::Follower) => "follower",
        Ok(v1::Role::Candidate) => "candidate",
        Ok(v1::Role::Learner) => "learner",
        Ok(v1::Role::Shutdown) => "shutdown",
        Ok(v1::Role::Unspecified) | Err(_) => "unspecified",
    }
}

/// A request id for a by-id call from a process that does not own the session's counter: the
/// current Unix time in microseconds. It is above the small counter values of the process that
/// opened the session and grows between invocations, so the server never mistakes it for a
/// retry of an earlier request.
fn detached_request_id() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(1)
        .max(1)
}

impl LockClient {
    /// Connects with [`ClientConfig::from_env`]: the defaults, with TLS from `LOCKD_CA`,
    /// `LOCKD_CERT`, `LOCKD_KEY` and a token from `LOCKD_TOKEN` when they are set (plaintext
    /// otherwise); see [`LockClient::connect_with`].
    pub async fn connect<S: AsRef<str>>(endpoints: &[S]) -> Result<Self, LockError> {
        Self::connect_with(endpoints, ClientConfig::from_env()?).await
    }

    /// Connects to a cluster given some of its nodes' addresses (`host:port`, `http://host:port`
    /// or `https://host:port`; followers are fine, the leader is found). Whether the channels
    /// speak TLS is [`ClientConfig::tls`]'s choice; an `https://` endpoint without it is
    /// refused. Must be called inside a Tokio runtime, whose tasks the sessions will use.
    ///
    /// Reads the TLS files, then asks every endpoint for its status once, to find the leader.
    /// `Err(InvalidArgument)` for an empty or malformed endpoint list, an invalid config, or a
    /// TLS file that cannot be read (naming it); `Err(Contention)` naming each endpoint's
    /// failure if none answered — with what to set when the failure looks like a TLS mismatch
    /// (a plaintext client at a TLS node, a CA that did not sign the node). A cluster that
    /// answers but has no leader yet is not an error: calls wait for the election within
    /// their budget.
    pub async fn connect_with<S: AsRef<str>>(
        endpoints: &[S],
        config: ClientConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        let router = Router::new(endpoints, config)?;
        router.discover().await?;
        Ok(Self {
            router: Arc::new(router),
            revoke_ids: Arc::new(AtomicU64::new((rand::random::<u64>() >> 2).max(1))),
            heartbeats: Arc::new(Heartbeats::default()),
        })
    }

    /// A client that has not asked any endpoint anything (no discovery), for unit tests of
    /// what a session does when its calls fail.
    #[cfg(test)]
    pub(crate) fn unconnected(endpoints: &[&str], config: ClientConfig) -> Self {
        Self {
            router: Arc::new(Router::new(endpoints, config).expect("valid test endpoints")),
            revoke_ids: Arc::new(AtomicU64::new(1)),
            heartbeats: Arc::new(Heartbeats::default()),
        }
    }

    pub(crate) fn router(&self) -> &Router {
        &self.router
    }

    pub(crate) fn heartbeats(&self) -> &Arc<Heartbeats> {
        &self.heartbeats
    }

    /// The configuration in force.
    pub fn config(&self) -> &ClientConfig {
        self.router.config()
    }

    /// Every endpoint known: the ones given to `connect`, then leaders learnt from hints.
    pub fn endpoints(&self) -> Vec<String> {
        self.router.endpoints()
    }

    /// The endpoint the next call goes to: the node believed to lead. A belief, not a fact.
    pub fn believed_leader(&self) -> String {
        self.router.current_endpoint()
    }

    /// Opens a session for `owner_id` with [`ClientConfig::session_ttl`] and starts its
    /// heartbeat (C2 §2.6 `openSession`). Every lock is acquired on a session and dies with it.
    ///
    /// `Err(InvalidArgument)` for a blank or over-long owner; `Err(Contention | NotLeader)` if
    /// the cluster could not be reached within the call budget. A retry after a lost answer
    /// may leave an unused session on the server; it holds nothing and ends with its TTL.
    pub async fn open_session(&self, owner_id: &str) -> Result<LockClientSession, LockError> {
        validate::owner_id(owner_id)?;
        let ttl = self.config().session_ttl;
        let ttl_ms = validate::ttl(ttl)?;
        let request = v1::OpenSessionRequest {
            owner_id: owner_id.to_owned(),
            ttl_ms,
        };
        let sent_at = crate::clock::now();
        let answer = self
            .router
            .unary(
                "open session",
                self.router.budget(Duration::ZERO),
                &request,
                |channel, request| async move {
                    v1::session_service_client::SessionServiceClient::new(channel)
                        .open_session(request)
                        .await
                },
            )
            .await?;
        validate::session_id(&answer.session_id).map_err(|err| {
            LockError::contention(format!("the server answered an unusable session id: {err}"))
        })?;
        // The server may grant less than asked, never trust more than asked.
        let granted = Duration::from_millis(answer.ttl_ms).min(ttl);
        if validate::ttl(granted).is_err() {
            return Err(LockError::contention(format!(
                "the server granted a session TTL of {} ms, outside the limits",
                answer.ttl_ms
            )));
        }
        Ok(LockClientSession::start(
            self.clone(),
            answer.session_id,
            owner_id.to_owned(),
            granted,
            sent_at,
        ))
    }

    /// See [`lock_api::LockService::inspect`]: a diagnostic snapshot, `Ok(None)` if `key` is
    /// unheld. Leader-confirmed unless [`ClientConfig::inspect_leader_confirmed`] is off.
    /// **Never usable for a correctness decision** (FR-07).
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.inspect_with(key, self.config().inspect_leader_confirmed)
            .await
    }

    pub(crate) async fn inspect_with(
        &self,
        key: &str,
        leader_confirmed: bool,
    ) -> Result<Option<LockInfo>, LockError> {
        validate::key(key)?;
        let request = v1::InspectRequest {
            key: key.to_owned(),
            leader_confirmed,
        };
        let answer = self
            .router
            .unary(
                "inspect",
                self.router.budget(Duration::ZERO),
                &request,
                |channel, request| async move {
                    v1::lock_service_client::LockServiceClient::new(channel)
                        .inspect(request)
                        .await
                },
            )
            .await?;
        Ok(answer.info.map(|info| LockInfo {
            key: info.key,
            owner_id: info.owner_id,
            session_id: info.session_id,
            fencing_token: info.fencing_token,
            acquired_at: system_time_from_unix_ms(info.acquired_at_unix_ms),
            expires_at: system_time_from_unix_ms(info.expires_at_unix_ms),
            waiter_count: info.waiter_count,
        }))
    }

    /// See [`lock_api::LockService::force_revoke`]: break-glass, audited with `operator` and
    /// `reason` (both non-blank). Retries reuse one request id, so a lost answer followed by a
    /// retry revokes at most once. On a node that authenticates its callers `operator` must be
    /// the caller's own principal (else `PermissionDenied`); [`LockClient::force_revoke_as_caller`]
    /// leaves it to the node.
    pub async fn force_revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        validate::key(key)?;
        validate::operator(operator)?;
        validate::reason(reason)?;
        self.revoke(key, operator, reason).await
    }

    /// [`LockClient::force_revoke`] recorded under the caller's authenticated principal (its
    /// client certificate's or its token's), which the node fills in: the request's `operator`
    /// is left blank. A node that authenticates nobody (`--insecure`) refuses it with
    /// `InvalidArgument`, since it has no name to record.
    pub async fn force_revoke_as_caller(
        &self,
        key: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        validate::key(key)?;
        validate::reason(reason)?;
        self.revoke(key, "", reason).await
    }

    /// The `ForceRevoke` call of both revokes, on arguments already checked.
    async fn revoke(
        &self,
        key: &str,
        operator: &str,
        reason: &str,
    ) -> Result<LockOutcome, LockError> {
        let request = v1::ForceRevokeRequest {
            key: key.to_owned(),
            operator: operator.to_owned(),
            reason: reason.to_owned(),
            request_id: self.revoke_ids.fetch_add(1, Ordering::Relaxed),
        };
        let answer = self
            .router
            .unary(
                "force revoke",
                self.router.budget(Duration::ZERO),
                &request,
                |channel, request| async move {
                    v1::lock_service_client::LockServiceClient::new(channel)
                        .force_revoke(request)
                        .await
                },
            )
            .await?;
        let outcome = answer.outcome.ok_or_else(|| {
            LockError::contention("the server answered a force-revoke without an outcome")
        })?;
        Ok(LockOutcome {
            key: outcome.key,
            revoked: outcome.revoked,
            previous_owner_id: Some(outcome.previous_owner_id).filter(|_| outcome.revoked),
            previous_token: Some(outcome.previous_token).filter(|_| outcome.revoked),
            new_token_floor: outcome.new_token_floor,
        })
    }

    /// One page of the force-revoke audit log (`AdminService.ListRevocations`), newest first:
    /// the revokes of `key` (of every key when `None`), at most `page_size` of them (0: the
    /// server's default; it serves at most `lock_proto::audit::REVOCATIONS_PAGE_SIZE_MAX`),
    /// starting after the page whose `next_page_token` is `page_token` (`None`: the first
    /// page). Read on the leader after it confirmed its leadership, so every revoke answered
    /// before the call is in it; the backend keeps the newest
    /// [`AUDIT_LOG_MAX`](crate::limits::AUDIT_LOG_MAX). A token the server did not issue for
    /// this `key` is `InvalidArgument`. Needs the `operator` role on a node that authenticates
    /// its callers.
    pub async fn list_revocations(
        &self,
        key: Option<&str>,
        page_size: u32,
        page_token: Option<&str>,
    ) -> Result<RevocationPage, LockError> {
        if let Some(key) = key {
            validate::key(key)?;
        }
        let request = v1::ListRevocationsRequest {
            key: key.unwrap_or_default().to_owned(),
            page_size,
            page_token: page_token.unwrap_or_default().to_owned(),
        };
        let answer = self
            .router
            .unary(
                "list revocations",
                self.router.budget(Duration::ZERO),
                &request,
                |channel, request| async move {
                    v1::admin_service_client::AdminServiceClient::new(channel)
                        .list_revocations(request)
                        .await
                },
            )
            .await?;
        Ok(RevocationPage {
            revocations: answer
                .revocations
                .into_iter()
                .map(|r| RevocationRecord {
                    key: r.key,
                    operator: r.operator,
                    reason: r.reason,
                    previous_owner_id: r.previous_owner_id,
                    previous_token: r.previous_token,
                    new_token_floor: r.new_token_floor,
                    revoked_at: system_time_from_unix_ms(r.revoked_at_unix_ms),
                    request_id: r.request_id,
                })
                .collect(),
            next_page_token: Some(answer.next_page_token).filter(|t| !t.is_empty()),
        })
    }

    /// Every known node's own view of the cluster (AdminService.Status), asked concurrently,
    /// one attempt each. A node that did not answer is listed with its error.
    pub async fn cluster_status(&self) -> Vec<NodeStatus> {
        self.router
            .status_all()
            .await
            .into_iter()
            .map(|(endpoint, answer)| NodeStatus {
                endpoint,
                view: match answer {
                    Ok(s) => NodeView::Up(NodeReport {
                        node_id: s.node_id,
                        role: role_name(s.role).to_owned(),
                        term: s.current_term,
                        leader_id: s.leader_id,
                        leader_addr: Some(s.leader_addr).filter(|a| !a.is_empty()),
                        commit_index: s.commit_index,
                        applied_index: s.applied_index,
                        last_log_index: s.last_log_index,
                        members: s
                            .members
                            .into_iter()
                            .map(|m| ClusterMember {
                                node_id: m.node_id,
                                addr: m.addr,
                                voter: m.voter,
                            })
                            .collect(),
                        cluster_id: s.cluster_id,
                    }),
                    Err(err) => NodeView::Down {
                        error: err.to_string(),
                    },
                },
            })
            .collect()
    }

    /// Heartbeats a session, retrying transient failures until `until`. `Ok(Some(ttl))`: alive
    /// for another `ttl` as the server answered it (zero if the server left it out);
    /// `Ok(None)`: the session is dead (terminal).
    pub(crate) async fn heartbeat_until(
        &self,
        session_id: &str,
        until: Instant,
    ) -> Result<Option<Duration>, LockError> {
        let request = v1::HeartbeatRequest {
            session_id: session_id.to_owned(),
        };
        let budget = Budget {
            deadline: until,
            attempt_timeout: self.config().attempt_timeout,
        };
        let answer = self
            .router
            .unary(
                "heartbeat",
                budget,
                &request,
                |channel, request| async move {
                    v1::session_service_client::SessionServiceClient::new(channel)
                        .heartbeat(request)
                        .await
                },
            )
            .await?;
        Ok(answer.alive.then(|| Duration::from_millis(answer.ttl_ms)))
    }

    /// Heartbeats several sessions in one `HeartbeatBatch` call, retrying transient failures of
    /// the whole call until `until`. `Ok(Some(answers))`: one answer per id, in order, each as
    /// [`LockClient::heartbeat_until`] would give it (`Ok(Some(ttl))` alive, `Ok(None)` dead,
    /// `Err` that session's own error). `Ok(None)`: the server does not know the call
    /// (`Unimplemented`); use unary heartbeats. `Err`: the call as a whole failed.
    pub(crate) async fn heartbeat_batch_until(
        &self,
        session_ids: &[String],
        until: Instant,
    ) -> Result<Option<Vec<Result<Option<Duration>, LockError>>>, LockError> {
        lock_proto::session::check_heartbeat_batch_len(session_ids.len())?;
        let request = v1::HeartbeatBatchRequest {
            session_ids: session_ids.to_vec(),
        };
        let budget = Budget {
            deadline: until,
            attempt_timeout: self.config().attempt_timeout,
        };
        let answer = self
            .router
            .call("heartbeat batch", budget, |channel, timeout| {
                let mut attempt = tonic::Request::new(request.clone());
                attempt.set_timeout(timeout);
                async move {
                    match v1::session_service_client::SessionServiceClient::new(channel)
                        .heartbeat_batch(attempt)
                        .await
                    {
                        Ok(response) => Ok(Some(response.into_inner())),
                        // Answered, not failed: the router must not retry it elsewhere.
                        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(None),
                        Err(status) => Err(status),
                    }
                }
            })
            .await?;
        let Some(answer) = answer else {
            return Ok(None);
        };
        if answer.results.len() != session_ids.len() {
            return Err(LockError::contention(format!(
                "the server answered {} heartbeat results for {} sessions",
                answer.results.len(),
                session_ids.len()
            )));
        }
        Ok(Some(
            answer
                .results
                .into_iter()
                .map(|result| match result.outcome {
                    Some(v1::heartbeat_batch_result::Outcome::Heartbeat(h)) => {
                        Ok(h.alive.then(|| Duration::from_millis(h.ttl_ms)))
                    }
                    Some(v1::heartbeat_batch_result::Outcome::Error(detail)) => {
                        Err(lock_proto::error::lock_error_from_detail(detail))
                    }
                    None => Err(LockError::contention(
                        "the server answered a heartbeat result without an outcome",
                    )),
                })
                .collect(),
        ))
    }

    /// Heartbeats the session `session_id` once (with retries within the call budget), for a
    /// process that did not open it (`lockctl renew`). `Ok(true)`: alive for another TTL;
    /// `Ok(false)`: the session and all its locks are gone — terminal, do not retry.
    pub async fn heartbeat_session(&self, session_id: &str) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        let until = crate::clock::now() + self.config().call_timeout;
        Ok(self.heartbeat_until(session_id, until).await?.is_some())
    }

    /// Renews the grant `(key, token)` of session `session_id` for `ttl`, for a process that
    /// did not open the session (`lockctl renew`). Same answers as
    /// [`lock_api::LockService::renew`]: `Ok(None)` means THE LOCK IS LOST NOW. The returned
    /// handle's deadline counts from before the request was sent, minus the safety margin.
    /// Renewing the grant does not keep the *session* alive; see
    /// [`LockClient::heartbeat_session`].
    pub async fn renew_detached(
        &self,
        session_id: &str,
        key: &str,
        token: u64,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        validate::fencing_token(token)?;
        let ttl_ms = validate::ttl(ttl)?;
        let margin = self.config().safety_margin.for_ttl(ttl);
        check_margin(ttl, margin)?;
        let request = v1::RenewRequest {
            session_id: session_id.to_owned(),
            request_id: detached_request_id(),
            key: key.to_owned(),
            fencing_token: token,
            ttl_ms,
        };
        let sent_at = crate::clock::now();
        let answer = self
            .router
            .unary(
                "renew",
                self.router.budget(Duration::ZERO),
                &request,
                |channel, request| async move {
                    v1::lock_service_client::LockServiceClient::new(channel)
                        .renew(request)
                        .await
                },
            )
            .await;
        match answer {
            Ok(response) => Ok(response
                .grant
                .map(|grant| handle_from_grant(grant, ttl, sent_at, margin))),
            Err(LockError::LockLost { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Releases the grant `(key, token)` of session `session_id`, for a process that did not
    /// open the session (`lockctl release`). Same answers as
    /// [`lock_api::LockService::release`]: `Ok(false)` means the grant was already gone.
    pub async fn release_detached(
        &self,
        session_id: &str,
        key: &str,
        token: u64,
    ) -> Result<bool, LockError> {
        validate::session_id(session_id)?;
        validate::key(key)?;
        validate::fencing_token(token)?;
        let request = v1::ReleaseRequest {
            session_id: session_id.to_owned(),
            request_id: detached_request_id(),
            key: key.to_owned(),
            fencing_token: token,
        };
        let answer = self
            .router
            .unary(
                "release",
                self.router.budget(Duration::ZERO),
                &request,
                |channel, request| async move {
                    v1::lock_service_client::LockServiceClient::new(channel)
                        .release(request)
                        .await
                },
            )
            .await?;
        Ok(answer.released)
    }

    /// Closes the session `session_id`, releasing every lock on it; returns how many. Closing
    /// a session that is already gone answers `Ok(0)`.
    pub async fn close_session(&self, session_id: &str) -> Result<u32, LockError> {
        validate::session_id(session_id)?;
        let request = v1::CloseSessionRequest {
            session_id: session_id.to_owned(),
        };
        let answer = self
            .router
            .unary(
                "close session",
                self.router.budget(Duration::ZERO),
                &request,
                |channel, request| async move {
                    v1::session_service_client::SessionServiceClient::new(channel)
                        .close_session(request)
                        .await
                },
            )
            .await?;
        Ok(answer.locks_released)
    }
}

/// The handle's server expiry in milliseconds since the Unix epoch (for JSON output).
pub fn server_expiry_unix_ms(handle: &LockHandle) -> u64 {
    unix_ms(handle.server_expiry)
}
