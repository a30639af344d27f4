//! Leader discovery and the retry loop: which node a call goes to, and what happens when it
//! fails.
//!
//! Owns the endpoint list (seeded by the caller, grown by `NotLeader` hints), one lazily
//! connected gRPC channel per endpoint, and the index of the node believed to lead. Every RPC
//! of the SDK goes through [`Router::call`], which:
//!
//! - follows a `NotLeader` hint to the named leader at once (a few times per call, then with
//!   backoff, so two confused nodes cannot bounce a call between them at full speed);
//! - on a `NotLeader` without a hint, a timeout, a transport failure or `Contention`, moves on
//!   to the next endpoint and waits a bounded, jittered, exponential backoff (FR-28);
//! - stops at the call's deadline and answers the last retry-safe error — `Contention` or
//!   `NotLeader` — never `LockLost` (docs/DESIGN.md D-errors): a failure to reach the cluster says
//!   nothing about the grant;
//! - returns any other error (`InvalidArgument`, `LockLost`, `FencedOut`) at once: retrying
//!   them cannot help.
//!
//! It decodes failures only through [`lock_proto::error::lock_error_from_status`], adding the
//! root cause of a transport failure ("Connection refused") to the message, and, when that
//! cause looks like the two ends disagreeing about TLS, what to set. It knows nothing of
//! sessions or handles.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_api::LockError;
use lock_proto::error::lock_error_from_status;
use lock_proto::v1;
use tonic::Status;

use crate::backoff::Backoff;
use crate::config::ClientConfig;
use crate::pipeline::Pipeline;
use crate::tls::{ENV_CA, ENV_CERT, ENV_KEY};
use crate::transport::{Dialer, Transport};

/// How many `NotLeader` hints one call follows immediately before it starts backing off.
/// Three covers a hint that is one election stale; more would let two nodes that each name the
/// other bounce a call without pause.
const REDIRECTS_IMMEDIATE_MAX: u32 = 3;

/// Most endpoints a client keeps. Hints add the leaders they name; a cluster is three or five
/// nodes, so a list this long only grows from a bug or a hostile server, and is capped.
const ENDPOINTS_MAX: usize = 64;

/// One node the client can talk to.
#[derive(Debug, Clone)]
struct Target {
    /// `host:port`, as the caller or a hint spelled it (without scheme).
    addr: String,
    channel: Transport,
    /// The lock calls to this node, on one stream (see [`Pipeline`]).
    pipeline: Arc<Pipeline>,
}

impl Target {
    fn new(addr: String, dialer: &Dialer) -> Result<Self, LockError> {
        let channel = dialer.dial(&addr)?;
        Ok(Self {
            pipeline: Arc::new(Pipeline::over(channel.clone())),
            channel,
            addr,
        })
    }
}

#[derive(Debug)]
struct RouterState {
    targets: Vec<Target>,
    /// Index in `targets` of the node the next call goes to: the believed leader.
    current: usize,
}

/// When a call must have finished, and how long one attempt may take.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// No attempt starts after this instant, and no backoff sleeps past it; the last attempt
    /// may run up to `attempt_timeout` beyond it.
    pub deadline: Instant,
    /// Timeout of one attempt.
    pub attempt_timeout: Duration,
}

/// The endpoint list, the believed leader and the retry loop. Shared by a client and all its
/// sessions.
#[derive(Debug)]
pub(crate) struct Router {
    config: ClientConfig,
    /// Builds each endpoint's channel (TLS and token included).
    dialer: Dialer,
    state: Mutex<RouterState>,
    /// Distinguishes the jitter seeds of calls when `config.jitter_seed` is set.
    calls: AtomicU64,
}

/// `host:port` from what a user typed: trims, drops an `http://` or `https://` scheme and a
/// trailing `/`. Whether the channel speaks TLS is the config's choice, not the scheme's
/// (`tls`), so `https://` without TLS configured is refused, naming what to set.
/// Rejects anything that is not a valid authority, naming it.
pub(crate) fn normalize_endpoint(raw: &str, tls: bool) -> Result<String, LockError> {
    let trimmed = raw.trim();
    let addr = match trimmed.strip_prefix("https://") {
        Some(_) if !tls => {
            return Err(LockError::invalid(format!(
                "endpoint {raw:?} asks for TLS but no CA is configured: set {ENV_CA} (lockctl: \
                 --ca) to the CA file that signs the cluster's certificates"
            )));
        }
        Some(rest) => rest,
        None => trimmed.strip_prefix("http://").unwrap_or(trimmed),
    }
    .trim_end_matches('/');
    if addr.is_empty() {
        return Err(LockError::invalid("endpoint must not be blank"));
    }
    if addr.contains("://") {
        return Err(LockError::invalid(format!(
            "endpoint {raw:?}: only http:// and https:// endpoints are supported"
        )));
    }
    let uri = format!("http://{addr}");
    match uri.parse::<tonic::codegen::http::Uri>() {
        Ok(parsed) if parsed.port_u16().is_some() && parsed.path() == "/" => Ok(addr.to_owned()),
        _ => Err(LockError::invalid(format!(
            "endpoint {raw:?} is not host:port"
        ))),
    }
}

impl Router {
    /// A router over `endpoints` (at least one, each `host:port` or `http://host:port`). Dials
    /// nothing yet: channels connect on first use. Must be called inside a Tokio runtime.
    pub(crate) fn new<S: AsRef<str>>(
        endpoints: &[S],
        config: ClientConfig,
    ) -> Result<Self, LockError> {
        let dialer = Dialer::new(&config)?;
        let mut targets: Vec<Target> = Vec::new();
        for raw in endpoints {
            let addr = normalize_endpoint(raw.as_ref(), dialer.is_tls())?;
            if targets.iter().any(|t| t.addr == addr) {
                continue;
            }
            if targets.len() == ENDPOINTS_MAX {
                return Err(LockError::invalid(format!(
                    "more than {ENDPOINTS_MAX} endpoints"
                )));
            }
            targets.push(Target::new(addr, &dialer)?);
        }
        if targets.is_empty() {
            return Err(LockError::invalid(
                "no endpoints given; pass at least one host:port",
            ));
        }
        Ok(Self {
            config,
            dialer,
            state: Mutex::new(RouterState {
                targets,
                current: 0,
            }),
            calls: AtomicU64::new(0),
        })
    }

    /// The configuration the router was built with.
    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// A budget of `extra + call_timeout` from now, with attempts of `extra + attempt_timeout`
    /// (`extra` is a blocking acquire's server-side wait, zero otherwise).
    pub(crate) fn budget(&self, extra: Duration) -> Budget {
        Budget {
            deadline: crate::clock::now() + extra + self.config.call_timeout,
            attempt_timeout: extra + self.config.attempt_timeout,
        }
    }

    /// The addresses known now, in order (the caller's, then those learnt from hints).
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.lock().targets.iter().map(|t| t.addr.clone()).collect()
    }

    /// The address the next call goes to.
    pub(crate) fn current_endpoint(&self) -> String {
        let state = self.lock();
        state.targets[state.current].addr.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RouterState> {
        // A panic while holding this lock leaves the state consistent (every write is a single
        // assignment or push), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn current(&self) -> (usize, Target) {
        let state = self.lock();
        (state.current, state.targets[state.current].clone())
    }

    /// Moves past endpoint `failed`, unless another call already moved on.
    fn rotate_from(&self, failed: usize) {
        let mut state = self.lock();
        if state.current == failed {
            state.current = (failed + 1) % state.targets.len();
        }
    }

    /// Points the router at `addr` (a hint), adding it to the list if it is new. Returns whether
    /// the router now points somewhere other than `from`.
    pub(crate) fn point_to(&self, raw_addr: &str, from: usize) -> bool {
        let Ok(addr) = normalize_endpoint(raw_addr, self.dialer.is_tls()) else {
            tracing::warn!(hint = raw_addr, "ignoring a malformed leader hint");
            return false;
        };
        let mut state = self.lock();
        if let Some(i) = state.targets.iter().position(|t| t.addr == addr) {
            state.current = i;
            return i != from;
        }
        if state.targets.len() >= ENDPOINTS_MAX {
            tracing::warn!(hint = %addr, "endpoint list full; ignoring a new leader hint");
            return false;
        }
        match Target::new(addr.clone(), &self.dialer) {
            Ok(target) => {
                state.targets.push(target);
                state.current = state.targets.len() - 1;
                true
            }
            Err(err) => {
                tracing::warn!(hint = %addr, %err, "ignoring an unusable leader hint");
                false
            }
        }
    }

    fn backoff(&self) -> Backoff {
        let seed = self
            .config
            .jitter_seed
            .map(|s| s.wrapping_add(self.calls.fetch_add(1, Ordering::Relaxed)));
        Backoff::new(self.config.backoff, seed)
    }

    /// [`Router::call`] for the common case: one unary RPC whose request is the same on every
    /// attempt. Wraps `request` with the attempt's timeout, sends it with `send` (which names the
    /// service client and method), and returns the answer's message.
    pub(crate) async fn unary<Req, Resp, F, Fut>(
        &self,
        what: &str,
        budget: Budget,
        request: &Req,
        send: F,
    ) -> Result<Resp, LockError>
    where
        Req: Clone,
        F: Fn(Transport, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        self.call(what, budget, |channel, timeout| {
            let mut attempt = tonic::Request::new(request.clone());
            attempt.set_timeout(timeout);
            send(channel, attempt)
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// [`Router::unary`] for the lock calls that travel on the believed leader's [`Pipeline`]:
    /// `send` gets the pipeline, a copy of `request` and the attempt's timeout.
    pub(crate) async fn piped<Req, Resp, F, Fut>(
        &self,
        what: &str,
        budget: Budget,
        request: &Req,
        send: F,
    ) -> Result<Resp, LockError>
    where
        Req: Clone,
        F: Fn(Arc<Pipeline>, Req, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        self.call_piped(what, budget, |pipeline, timeout| {
            send(pipeline, request.clone(), timeout)
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// Runs `attempt` against the believed leader until it answers, retrying retry-safe
    /// failures elsewhere with backoff until `budget.deadline` (see the module doc).
    ///
    /// `attempt` gets the channel and the attempt's timeout (to put on the request) and must
    /// be repeatable: a retry of a mutating call must reuse its request id. `what` names the
    /// call in error messages.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        what: &str,
        budget: Budget,
        mut attempt: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(Transport, Duration) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.call_target(what, budget, |target, timeout| {
            attempt(target.channel.clone(), timeout)
        })
        .await
    }

    /// [`Router::call`] for the lock calls that travel on a node's [`Pipeline`]: `attempt` gets
    /// the believed leader's pipeline instead of its channel.
    pub(crate) async fn call_piped<T, F, Fut>(
        &self,
        what: &str,
        budget: Budget,
        mut attempt: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(Arc<Pipeline>, Duration) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.call_target(what, budget, |target, timeout| {
            attempt(target.pipeline.clone(), timeout)
        })
        .await
    }

    async fn call_target<T, F, Fut>(
        &self,
        what: &str,
        budget: Budget,
        mut attempt: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(&Target, Duration) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut backoff = self.backoff();
        let mut redirects = 0u32;
        let mut attempts = 0u32;
        loop {
            let (index, target) = self.current();
            let attempt_timeout = budget.attempt_timeout;
            attempts += 1;
            let result =
                tokio::time::timeout(attempt_timeout, attempt(&target, attempt_timeout)).await;
            let err = match result {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(status)) => with_tls_hint(error_from_status(&status), self.dialer.is_tls()),
                Err(_elapsed) => LockError::contention(format!(
                    "no answer within {} ms",
                    attempt_timeout.as_millis()
                )),
            };
            let immediate = match &err {
                LockError::NotLeader {
                    leader_addr: Some(hint),
                    ..
                } => {
                    if self.point_to(hint, index) {
                        redirects < REDIRECTS_IMMEDIATE_MAX
                    } else {
                        // A hint naming the node that just refused (stale), or an unusable one:
                        // try elsewhere.
                        self.rotate_from(index);
                        false
                    }
                }
                LockError::NotLeader { .. } | LockError::Contention { .. } => {
                    self.rotate_from(index);
                    false
                }
                _ => {
                    crate::events::observe(&err);
                    return Err(err);
                }
            };
            tracing::debug!(what, endpoint = %target.addr, %err, attempts, "retrying");
            let err = match err {
                LockError::Contention { message } => LockError::contention(format!(
                    "{what} via {}: {message} (after {attempts} attempt(s))",
                    target.addr
                )),
                other => other,
            };
            let now = crate::clock::now();
            if immediate {
                redirects += 1;
                if now >= budget.deadline {
                    return Err(err);
                }
                continue;
            }
            let delay = backoff.next_delay();
            if now + delay >= budget.deadline {
                return Err(err);
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// Asks every known endpoint for its view of the cluster, concurrently, one attempt each.
    pub(crate) async fn status_all(&self) -> Vec<(String, Result<v1::StatusResponse, LockError>)> {
        let targets = self.lock().targets.clone();
        let timeout = self.config.attempt_timeout;
        let mut tasks = Vec::with_capacity(targets.len());
        for target in targets {
            tasks.push(tokio::spawn(async move {
                let mut client = v1::admin_service_client::AdminServiceClient::new(target.channel);
                let mut request = tonic::Request::new(v1::StatusRequest {});
                request.set_timeout(timeout);
                let answer = match tokio::time::timeout(timeout, client.status(request)).await {
                    Ok(Ok(response)) => Ok(response.into_inner()),
                    Ok(Err(status)) => Err(error_from_status(&status)),
                    Err(_) => Err(LockError::contention(format!(
                        "no answer within {} ms",
                        timeout.as_millis()
                    ))),
                };
                (target.addr, answer)
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for task in tasks {
            match task.await {
                Ok(pair) => out.push(pair),
                Err(join) => tracing::warn!(%join, "status task failed"),
            }
        }
        out
    }

    /// Finds the leader by asking every endpoint for its status, and points the router at it.
    ///
    /// `Ok(())` if at least one endpoint answered (even if no leader is known yet: calls will
    /// retry until one is elected). `Err(Contention)` naming each endpoint's failure if none
    /// answered.
    pub(crate) async fn discover(&self) -> Result<(), LockError> {
        let answers = self.status_all().await;
        let mut failures = Vec::new();
        let mut reachable = false;
        let mut leader: Option<String> = None;
        for (addr, answer) in answers {
            match answer {
                Ok(status) => {
                    reachable = true;
                    if status.leader_id.is_some() && !status.leader_addr.is_empty() {
                        leader.get_or_insert(status.leader_addr);
                    }
                }
                Err(LockError::Contention { message }) => {
                    failures.push(format!("{addr}: {message}"))
                }
                Err(err) => failures.push(format!("{addr}: {err}")),
            }
        }
        if let Some(addr) = leader {
            self.point_to(&addr, usize::MAX);
        }
        if reachable {
            Ok(())
        } else {
            // The TLS advice once, after every endpoint's failure, not once per endpoint.
            Err(with_tls_hint(
                LockError::contention(format!(
                    "no lockd endpoint answered ({})",
                    failures.join("; ")
                )),
                self.dialer.is_tls(),
            ))
        }
    }
}

/// How many sources of a transport error [`root_cause`] follows: the chain tonic builds is
/// three or four deep (status, transport, connector, I/O), so this only stops a cyclic one.
const SOURCE_DEPTH_MAX: usize = 16;

/// [`lock_error_from_status`], with the cause of a transport failure appended, and a hint when
/// the cause looks like a TLS mismatch (`tls`: whether this client speaks TLS). tonic's own
/// message says only "tcp connect error" or "transport error"; what a user can act on —
/// "Connection refused", an unknown host, a certificate the client does not trust — is in the
/// status's sources.
fn error_from_status(status: &Status) -> LockError {
    match lock_error_from_status(status) {
        LockError::Contention { message } => match root_cause(status) {
            Some(cause) if !message.contains(&cause) => {
                LockError::contention(format!("{message}: {cause}"))
            }
            _ => LockError::Contention { message },
        },
        other => other,
    }
}

/// `err` with [`tls_hint`]'s advice appended once, if its message looks like a TLS mismatch.
fn with_tls_hint(err: LockError, tls: bool) -> LockError {
    match err {
        LockError::Contention { message } => match tls_hint(&message, tls) {
            Some(hint) => LockError::contention(format!("{message}; {hint}")),
            None => LockError::Contention { message },
        },
        other => other,
    }
}

/// Words in a transport failure that mean the TLS handshake itself failed (rustls' errors:
/// "invalid peer certificate: UnknownIssuer", "received corrupt message of type
/// InvalidContentType", "tls handshake eof", "received fatal alert: …").
const TLS_FAILURE_WORDS: &[&str] = &[
    "certificate",
    "tls",
    "handshake",
    "corrupt message",
    "alert",
];

/// Words in a transport failure that mean a plaintext connection was accepted and then closed
/// or answered with bytes that are not HTTP/2 — what a TLS node does to a plaintext client.
/// "Connection refused" and timeouts are not among them: those say the node is down, not that
/// it speaks TLS.
const PLAINTEXT_REFUSED_WORDS: &[&str] = &[
    "connection reset",
    "connection closed",
    "broken pipe",
    "unexpected end of file",
    "unexpected eof",
    "early eof",
    "h2 protocol error",
    "frame with invalid size",
    "invalid http version",
];

/// How each of [`tls_hint`]'s hints begins, so [`crate::tls::is_tls_mismatch`] can tell an
/// error that carries one.
pub(crate) const TLS_HINT_OPENINGS: [&str; 3] = [
    "the node requires a client certificate",
    "the TLS handshake failed",
    "the node closed a plaintext connection",
];

/// What to set when `message` (a transport failure) looks like the two ends disagreeing
/// about TLS; `None` otherwise. Each hint begins with one of [`TLS_HINT_OPENINGS`].
fn tls_hint(message: &str, tls: bool) -> Option<String> {
    let lower = message.to_ascii_lowercase();
    if tls && lower.contains("certificaterequired") {
        return Some(format!(
            "the node requires a client certificate: set {ENV_CERT} and {ENV_KEY} (lockctl: \
             --tls-cert, --tls-key) to one signed by the cluster's CA"
        ));
    }
    if tls {
        TLS_FAILURE_WORDS
            .iter()
            .any(|word| lower.contains(word))
            .then(|| {
                format!(
                    "the TLS handshake failed: check that {ENV_CA} is the CA that signed the \
                     node's certificate, that the node serves TLS (not --insecure), and that \
                     the client certificate ({ENV_CERT}/{ENV_KEY}) is one the node accepts"
                )
            })
    } else {
        PLAINTEXT_REFUSED_WORDS
            .iter()
            .any(|word| lower.contains(word))
            .then(|| {
                format!(
                    "the node closed a plaintext connection: if it serves TLS, set {ENV_CA} \
                     (lockctl: --tls-ca) to the cluster's CA file, and {ENV_CERT}/{ENV_KEY} to \
                     a client certificate"
                )
            })
    }
}

/// The innermost source of `status`, if it has one.
fn root_cause(status: &Status) -> Option<String> {
    let mut cause = std::error::Error::source(status)?;
    for _ in 0..SOURCE_DEPTH_MAX {
        match cause.source() {
            Some(next) => cause = next,
            None => break,
        }
    }
    Some(cause.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalized_and_bad_ones_named() {
        assert_eq!(
            normalize_endpoint(" 127.0.0.1:7101 ", false).as_deref(),
            Ok("127.0.0.1:7101")
        );
        assert_eq!(
            normalize_endpoint("http://localhost:7101/", false).as_deref(),
            Ok("localhost:7101")
        );
        assert_eq!(
            normalize_endpoint("https://localhost:7101", true).as_deref(),
            Ok("localhost:7101")
        );
        match normalize_endpoint("https://x:1", false) {
            Err(LockError::InvalidArgument { message }) => {
                assert!(message.contains("LOCKD_CA"), "{message}")
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        for bad in [
            "",
            "localhost",
            "https://x:1",
            "a b:1",
            "host:1/path",
            "ftp://x:1",
        ] {
            assert!(
                matches!(
                    normalize_endpoint(bad, false),
                    Err(LockError::InvalidArgument { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tls_mismatches_get_a_hint_and_a_node_that_is_down_does_not() {
        let plaintext_refused = tls_hint("transport error: connection reset by peer", false);
        assert!(
            plaintext_refused
                .as_deref()
                .is_some_and(|h| h.contains("TLS") && h.contains("LOCKD_CA")),
            "{plaintext_refused:?}"
        );
        let untrusted = tls_hint("invalid peer certificate: UnknownIssuer", true);
        assert!(
            untrusted
                .as_deref()
                .is_some_and(|h| h.contains("TLS") && h.contains("LOCKD_CA")),
            "{untrusted:?}"
        );
        assert_eq!(
            tls_hint(
                "tcp connect error: Connection refused (os error 111)",
                false
            ),
            None
        );
        assert_eq!(
            tls_hint("tcp connect error: Connection refused (os error 111)", true),
            None
        );
    }

    #[test]
    fn a_missing_client_certificate_is_named() {
        let no_cert = tls_hint(
            "transport error: received fatal alert: CertificateRequired",
            true,
        );
        assert!(
            no_cert
                .as_deref()
                .is_some_and(|h| h.contains("LOCKD_CERT") && h.contains("LOCKD_KEY")),
            "{no_cert:?}"
        );
    }

    #[tokio::test]
    async fn duplicate_endpoints_collapse_and_hints_extend_the_list() {
        let router = Router::new(
            &["127.0.0.1:1", "http://127.0.0.1:1", "127.0.0.1:2"],
            ClientConfig::default(),
        )
        .expect("router");
        assert_eq!(router.endpoints(), vec!["127.0.0.1:1", "127.0.0.1:2"]);
        assert!(router.point_to("127.0.0.1:3", 0));
        assert_eq!(router.current_endpoint(), "127.0.0.1:3");
        assert!(router.point_to("127.0.0.1:2", 2));
        assert_eq!(router.endpoints().len(), 3);
        router.rotate_from(1);
        assert_eq!(router.current_endpoint(), "127.0.0.1:3");
        // A stale rotation (another call already moved on) does nothing.
        router.rotate_from(1);
        assert_eq!(router.current_endpoint(), "127.0.0.1:3");
        assert!(Router::new::<&str>(&[], ClientConfig::default()).is_err());
    }
}
