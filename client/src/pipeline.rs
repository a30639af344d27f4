//! `LockService.Pipeline` from the client's side: the acquire, try-acquire, cancel, renew and
//! release calls of every session on one node, multiplexed on one long-lived stream and matched
//! to their answers by `call_id`.
//!
//! Why: a unary gRPC call costs a new HTTP/2 stream, a header block each way and, from a tonic
//! client, two writes (headers, then body) that wake the server twice. On an open stream a call
//! is one DATA frame each way, and calls made together leave in one write.
//!
//! Owns the stream's lifecycle and the table of calls waiting for answers. It does not retry:
//! a failed call (the stream broke, the node went away) answers a retry-safe `Unavailable`
//! status and the caller's retry loop (`router`) decides, reusing the request id as for any
//! retry. Each call method answers exactly what the unary call of the same name would, so a
//! caller can use either.
//!
//! Lifecycle: the stream opens on the first call. It is dropped (and the calls waiting on it
//! fail) when the node closes it or the transport fails; the next call opens a new one. A node
//! that answers `UNIMPLEMENTED` (an older lockd) is sent unary calls from then on.
//!
//! Cancellation: dropping a call's future forgets its entry in the table; the server still
//! finishes the call, within the `timeout_ms` the call carried, and its answer is discarded.
//! That is exactly a unary call whose client gave up after sending.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use lock_proto::error::{lock_error_from_detail, status_from_lock_error};
use lock_proto::pipeline::PIPELINE_CALLS_IN_FLIGHT_MAX;
use lock_proto::v1;
use lock_proto::v1::lock_service_client::LockServiceClient;
use lock_proto::v1::pipeline_request::Call;
use lock_proto::v1::pipeline_response::Answer;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::transport::Transport;

/// The unary client a call falls back to.
type Unary = LockServiceClient<Transport>;

/// The pipeline of calls to one node. Cheap to share (`Arc`); every method takes `&self`.
pub struct Pipeline {
    /// The node's channel, with the client's credentials on every request (the stream's too).
    channel: Transport,
    shared: Arc<Shared>,
    next_call_id: AtomicU64,
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match &*self.shared.state() {
            Mode::Closed => "closed",
            Mode::Open(_) => "open",
            Mode::Unsupported => "unary",
        };
        f.debug_struct("Pipeline").field("mode", &mode).finish()
    }
}

struct Shared {
    mode: Mutex<Mode>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, Mode> {
        self.mode
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

enum Mode {
    /// No stream: the next call opens one.
    Closed,
    Open(Arc<Stream>),
    /// The node does not serve `Pipeline`: unary calls only.
    Unsupported,
}

/// One open stream: where calls are sent, and who waits for which answer.
///
/// Only the pipeline (and calls in progress) hold `requests`; the task reading answers holds
/// just the table and a weak reference to the pipeline. So dropping the pipeline closes the
/// request side, the node finishes what runs and ends the stream, and the task ends too.
struct Stream {
    requests: mpsc::Sender<v1::PipelineRequest>,
    table: Arc<Table>,
}

/// The calls waiting for an answer on one stream.
#[derive(Default)]
struct Table(Mutex<Waiting>);

#[derive(Default)]
struct Waiting {
    calls: HashMap<u64, oneshot::Sender<Result<Answer, Status>>>,
    /// Set when the stream ended: every later call on it fails at once with this.
    ended: Option<Status>,
    /// The stream has delivered an answer, so the node serves `Pipeline`.
    answered: bool,
}

impl Table {
    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Fails every waiting call with `status` and refuses new ones.
    fn end(&self, status: Status) {
        let calls = {
            let mut waiting = self.waiting();
            waiting.ended = Some(status.clone());
            std::mem::take(&mut waiting.calls)
        };
        for (_, reply) in calls {
            let _ = reply.send(Err(status.clone()));
        }
    }
}

/// Forgets a call's entry when its future is dropped before the answer came.
struct Forget<'a> {
    table: &'a Table,
    call_id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.table.waiting().calls.remove(&self.call_id);
    }
}

/// What a call got back from the stream.
enum Outcome {
    Answer(Answer),
    /// The node does not serve `Pipeline`; the call was not made.
    Unsupported,
}

impl Pipeline {
    /// A pipeline to the node behind `channel`, which carries its own TLS config if any; no
    /// bearer token is added. Opens nothing until the first call.
    pub fn new(channel: Channel) -> Self {
        Self::over(crate::transport::plain(channel))
    }

    /// A pipeline over one of the client's transports (its token on every request).
    pub(crate) fn over(channel: Transport) -> Self {
        Self {
            channel,
            shared: Arc::new(Shared {
                mode: Mutex::new(Mode::Closed),
            }),
            next_call_id: AtomicU64::new(1),
        }
    }

    /// Whether calls go to the node unary because it does not serve `Pipeline`.
    pub fn is_unary(&self) -> bool {
        matches!(*self.shared.state(), Mode::Unsupported)
    }

    /// The open stream, opening one if there is none; `None` if the node is known not to serve
    /// `Pipeline`.
    fn stream(&self) -> Option<Arc<Stream>> {
        let mut mode = self.shared.state();
        match &*mode {
            Mode::Open(stream) => return Some(stream.clone()),
            Mode::Unsupported => return None,
            Mode::Closed => {}
        }
        let (requests, outgoing) = mpsc::channel(PIPELINE_CALLS_IN_FLIGHT_MAX);
        let stream = Arc::new(Stream {
            requests,
            table: Arc::default(),
        });
        *mode = Mode::Open(stream.clone());
        tokio::spawn(read_answers(
            self.channel.clone(),
            outgoing,
            stream.table.clone(),
            Arc::downgrade(&self.shared),
        ));
        Some(stream)
    }

    /// Sends `call`, bounded server-side by `timeout`, and waits for its answer.
    async fn call(&self, call: Call, timeout: Duration) -> Result<Outcome, Status> {
        let Some(stream) = self.stream() else {
            return Ok(Outcome::Unsupported);
        };
        let call_id = self.next_call_id.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        {
            let mut waiting = stream.table.waiting();
            if let Some(status) = &waiting.ended {
                return Err(status.clone());
            }
            waiting.calls.insert(call_id, reply);
        }
        let _forget = Forget {
            table: &stream.table,
            call_id,
        };
        let request = v1::PipelineRequest {
            call_id,
            // At least 1 ms: 0 would mean "no bound" to the server.
            timeout_ms: u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            call: Some(call),
        };
        if stream.requests.send(request).await.is_err() {
            return Err(Status::unavailable(
                "the pipeline stream closed before the call left",
            ));
        }
        match answer.await {
            Ok(Ok(Answer::Error(detail))) => {
                Err(status_from_lock_error(&lock_error_from_detail(detail)))
            }
            Ok(Ok(answer)) => Ok(Outcome::Answer(answer)),
            Ok(Err(status)) if status.code() == Code::Unimplemented => Ok(Outcome::Unsupported),
            Ok(Err(status)) => Err(status),
            Err(_) => Err(Status::unavailable(
                "the pipeline stream ended without an answer",
            )),
        }
    }

    /// `LockService.Acquire` on the pipeline (unary if the node has none).
    pub async fn acquire(
        &self,
        request: v1::AcquireRequest,
        timeout: Duration,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let answer = |a| match a {
            Answer::Acquire(m) => Ok(m),
            other => Err(other),
        };
        let unary = |mut c: Unary, r| async move { c.acquire(r).await };
        self.send("acquire", request, timeout, Call::Acquire, answer, unary)
            .await
    }

    /// `LockService.TryAcquire` on the pipeline (unary if the node has none).
    pub async fn try_acquire(
        &self,
        request: v1::TryAcquireRequest,
        timeout: Duration,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let answer = |a| match a {
            Answer::Acquire(m) => Ok(m),
            other => Err(other),
        };
        let unary = |mut c: Unary, r| async move { c.try_acquire(r).await };
        self.send(
            "try_acquire",
            request,
            timeout,
            Call::TryAcquire,
            answer,
            unary,
        )
        .await
    }

    /// `LockService.CancelAcquire` on the pipeline (unary if the node has none).
    pub async fn cancel_acquire(
        &self,
        request: v1::CancelAcquireRequest,
        timeout: Duration,
    ) -> Result<Response<v1::CancelAcquireResponse>, Status> {
        let answer = |a| match a {
            Answer::CancelAcquire(m) => Ok(m),
            other => Err(other),
        };
        let unary = |mut c: Unary, r| async move { c.cancel_acquire(r).await };
        self.send(
            "cancel_acquire",
            request,
            timeout,
            Call::CancelAcquire,
            answer,
            unary,
        )
        .await
    }

    /// `LockService.Renew` on the pipeline (unary if the node has none).
    pub async fn renew(
        &self,
        request: v1::RenewRequest,
        timeout: Duration,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        let answer = |a| match a {
            Answer::Renew(m) => Ok(m),
            other => Err(other),
        };
        let unary = |mut c: Unary, r| async move { c.renew(r).await };
        self.send("renew", request, timeout, Call::Renew, answer, unary)
            .await
    }

    /// `LockService.Release` on the pipeline (unary if the node has none).
    pub async fn release(
        &self,
        request: v1::ReleaseRequest,
        timeout: Duration,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let answer = |a| match a {
            Answer::Release(m) => Ok(m),
            other => Err(other),
        };
        let unary = |mut c: Unary, r| async move { c.release(r).await };
        self.send("release", request, timeout, Call::Release, answer, unary)
            .await
    }

    /// Sends `request` as `call(request)` and takes its message out of the answer with
    /// `answer` (which hands back any other variant, a server bug); if the node turns out not
    /// to serve `Pipeline`, sends it with `unary` instead.
    async fn send<Req, Resp, U, UFut>(
        &self,
        what: &str,
        request: Req,
        timeout: Duration,
        call: fn(Req) -> Call,
        answer: impl FnOnce(Answer) -> Result<Resp, Answer>,
        unary: U,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Clone,
        U: FnOnce(Unary, tonic::Request<Req>) -> UFut,
        UFut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let fallback = self.may_fall_back().then(|| request.clone());
        match self.call(call(request), timeout).await? {
            Outcome::Answer(a) => answer(a)
                .map(Response::new)
                .map_err(|other| unexpected(what, other)),
            Outcome::Unsupported => {
                let request = fallback.ok_or_else(lost_request)?;
                unary(self.unary(), with_timeout(request, timeout)).await
            }
        }
    }

    /// Whether a call may still learn that the node has no `Pipeline` and need its request
    /// again for a unary call: only until a stream has answered once.
    fn may_fall_back(&self) -> bool {
        match &*self.shared.state() {
            Mode::Open(stream) => !stream.table.waiting().answered,
            Mode::Closed | Mode::Unsupported => true,
        }
    }

    fn unary(&self) -> Unary {
        LockServiceClient::new(self.channel.clone())
    }
}

fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A call learned that the node no longer serves `Pipeline` after its request was given up
/// (a stream had answered before, so no copy was kept). Retry-safe: the router's next attempt
/// goes unary.
fn lost_request() -> Status {
    Status::unavailable("the node stopped serving Pipeline mid-call; retrying as a unary call")
}

fn unexpected(call: &str, answer: Answer) -> Status {
    Status::internal(format!(
        "pipeline: the node answered a {call} call with {answer:?}"
    ))
}

/// Opens the stream that `outgoing` feeds and hands each answer to its waiting call, until the
/// stream ends; then fails the calls still waiting and marks the pipeline closed (or unary, if
/// the node does not serve `Pipeline`), unless a newer stream has replaced this one.
async fn read_answers(
    channel: Transport,
    outgoing: mpsc::Receiver<v1::PipelineRequest>,
    table: Arc<Table>,
    shared: Weak<Shared>,
) {
    let opened = LockServiceClient::new(channel)
        .pipeline(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await;
    let ended = match opened {
        Err(status) => status,
        Ok(answers) => {
            let mut answers = answers.into_inner();
            loop {
                match answers.message().await {
                    Ok(Some(answer)) => deliver(&table, answer),
                    Ok(None) => break Status::unavailable("the node ended the pipeline stream"),
                    Err(status) => break status,
                }
            }
        }
    };
    let unsupported = ended.code() == Code::Unimplemented;
    if let Some(shared) = shared.upgrade() {
        let mut mode = shared.state();
        if matches!(&*mode, Mode::Open(current) if Arc::ptr_eq(&current.table, &table)) {
            *mode = if unsupported {
                tracing::info!(
                    "the node does not serve LockService.Pipeline (an older lockd?); using unary calls"
                );
                Mode::Unsupported
            } else {
                tracing::debug!(status = %ended, "pipeline stream ended; the next call opens another");
                Mode::Closed
            };
        }
    }
    table.end(ended);
}

/// Hands `answer` to the call waiting for it; an answer nobody waits for (the caller gave up)
/// is dropped.
fn deliver(table: &Table, answer: v1::PipelineResponse) {
    let reply = {
        let mut waiting = table.waiting();
        waiting.answered = true;
        waiting.calls.remove(&answer.call_id)
    };
    let Some(reply) = reply else {
        return;
    };
    let result = answer.answer.ok_or_else(|| {
        Status::internal(format!("pipeline call {} answered nothing", answer.call_id))
    });
    let _ = reply.send(result);
}
