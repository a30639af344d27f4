//! The server side of `LockService.Pipeline`: many lock calls on one stream, run concurrently,
//! each answered with its `call_id` as soon as it finishes.
//!
//! Owns the stream's bookkeeping only: reading calls while fewer than
//! [`PIPELINE_CALLS_IN_FLIGHT_MAX`] run, and handing back whichever finishes first. A call is
//! run by the work its unary method does ([`run_call`]: `LockApi::acquire_as` and the like),
//! so it means exactly what the unary call means, on the Raft node and on a stateless one
//! alike; a failure travels as the `ErrorDetail` of its `LockError`, converted once, and is
//! counted with the status code the unary call would have answered.
//!
//! Lifetime: when the client closes its side, or the node starts shutting down, no new call is
//! read, the running calls finish and then the stream ends: a stopping node takes no new call
//! on an open stream, as it takes no new unary call. When the client cancels the stream, or
//! its side fails, hyper drops this stream and with it every running call, as it would drop a
//! unary call's future (a waiting acquire is withdrawn). A transport error on the incoming side ends the stream with that status, since
//! the calls still running can no longer be matched by a client that lost its side.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use lock_api::LockError;
use lock_proto::error::{code_of, error_detail_from_lock_error};
use lock_proto::pipeline::PIPELINE_CALLS_IN_FLIGHT_MAX;
use lock_proto::v1::pipeline_request::Call;
use lock_proto::v1::pipeline_response::Answer;
use lock_proto::v1::{PipelineRequest, PipelineResponse};
use tokio::sync::watch;
use tonic::{Code, Status};

use super::lock::LockApi;
use crate::backend::Backend;
use crate::metrics::grpc::CallMeters;
use crate::peer::Caller;

/// The answers of one `Pipeline` stream, in completion order.
pub type PipelineAnswers = Pin<Box<dyn Stream<Item = Result<PipelineResponse, Status>> + Send>>;

/// Serves the calls arriving on `incoming` with `service`'s lock calls, until the client
/// closes its side or `stop` turns `true` (the node is shutting down). Each call carries the
/// stream's `caller` (`None` on an `--insecure` node), as a unary call carries its own, and is
/// counted under its unary method's name in `meters` (the stream itself is counted by the
/// serve loop's layer as `Pipeline`).
pub fn serve_pipeline<B, S>(
    service: LockApi<B>,
    incoming: S,
    stop: watch::Receiver<bool>,
    meters: Option<CallMeters>,
    caller: Option<Caller>,
) -> PipelineAnswers
where
    B: Backend,
    S: Stream<Item = Result<PipelineRequest, Status>> + Send + Unpin + 'static,
{
    let run = move |call| {
        let service = service.clone();
        let meters = meters.clone();
        let caller = caller.clone();
        async move { run_call(&service, call, meters.as_ref(), caller.as_ref()).await }
    };
    Box::pin(Pipeline::new(incoming, run).until(stop))
}

/// Runs one pipeline call through `service`'s work for its unary method, as `caller`, within
/// the call's `timeout_ms` if it set one, and answers it with its `call_id`; counts it in
/// `meters` under the unary method's name with the status code the unary call would have
/// answered.
pub async fn run_call<B: Backend>(
    service: &LockApi<B>,
    request: PipelineRequest,
    meters: Option<&CallMeters>,
    caller: Option<&Caller>,
) -> PipelineResponse {
    let PipelineRequest {
        call_id,
        timeout_ms,
        call,
    } = request;
    let started = Instant::now();
    let method = match &call {
        Some(Call::Acquire(_)) => "Acquire",
        Some(Call::TryAcquire(_)) => "TryAcquire",
        Some(Call::CancelAcquire(_)) => "CancelAcquire",
        Some(Call::Renew(_)) => "Renew",
        Some(Call::Release(_)) => "Release",
        None => "PipelineEmpty",
    };
    let caller = caller.map(|c| c.principal.as_str());
    let work = async {
        match call {
            Some(Call::Acquire(r)) => answer(service.acquire_as(caller, r).await, Answer::Acquire),
            Some(Call::TryAcquire(r)) => {
                answer(service.try_acquire_as(caller, r).await, Answer::Acquire)
            }
            Some(Call::CancelAcquire(r)) => answer(
                service.cancel_acquire_as(caller, r).await,
                Answer::CancelAcquire,
            ),
            Some(Call::Renew(r)) => answer(service.renew_as(caller, r).await, Answer::Renew),
            Some(Call::Release(r)) => answer(service.release_as(caller, r).await, Answer::Release),
            None => refused(&LockError::invalid(format!(
                "pipeline call {call_id} carries no call \
                 (acquire, try_acquire, cancel_acquire, renew or release)"
            ))),
        }
    };
    let (answer, code) = match timeout_ms {
        0 => work.await,
        ms => match tokio::time::timeout(Duration::from_millis(ms), work).await {
            Ok(answer) => answer,
            Err(_) => refused(&LockError::contention(format!(
                "pipeline call {call_id}: no answer within its timeout of {ms} ms; \
                 the outcome is unknown, retry with the same request id"
            ))),
        },
    };
    if let Some(meters) = meters {
        meters.record(method, code, started.elapsed());
    }
    PipelineResponse {
        call_id,
        answer: Some(answer),
    }
}

/// A lock call's outcome as a pipeline answer, with the status code the unary call would have
/// answered.
fn answer<M>(result: Result<M, LockError>, variant: fn(M) -> Answer) -> (Answer, Code) {
    match result {
        Ok(message) => (variant(message), Code::Ok),
        Err(err) => refused(&err),
    }
}

/// A refused call's error detail and the code the unary call would have answered.
fn refused(err: &LockError) -> (Answer, Code) {
    (
        Answer::Error(error_detail_from_lock_error(err)),
        code_of(err),
    )
}

/// Runs the calls arriving on `incoming` through `run`, at most `in_flight_max` at a time.
pub struct Pipeline<S, F, Fut> {
    /// `None` once the client closed its side (or it failed).
    incoming: Option<S>,
    running: FuturesUnordered<Fut>,
    run: F,
    in_flight_max: usize,
    /// Resolves when the node starts shutting down: read no more calls.
    stop: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<S, F, Fut> std::fmt::Debug for Pipeline<S, F, Fut> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("reading", &self.incoming.is_some())
            .field("running", &self.running.len())
            .field("in_flight_max", &self.in_flight_max)
            .finish_non_exhaustive()
    }
}

impl<S, F, Fut> Pipeline<S, F, Fut>
where
    S: Stream<Item = Result<PipelineRequest, Status>> + Unpin,
    F: FnMut(PipelineRequest) -> Fut,
    Fut: Future<Output = PipelineResponse>,
{
    /// A pipeline over `incoming` with the protocol's bound on calls in flight.
    pub fn new(incoming: S, run: F) -> Self {
        Self::with_bound(incoming, run, PIPELINE_CALLS_IN_FLIGHT_MAX)
    }

    /// A pipeline over `incoming` running at most `in_flight_max` (at least 1) calls at once.
    pub fn with_bound(incoming: S, run: F, in_flight_max: usize) -> Self {
        Self {
            incoming: Some(incoming),
            running: FuturesUnordered::new(),
            run,
            in_flight_max: in_flight_max.max(1),
            stop: None,
        }
    }

    /// The same pipeline, reading no new call once `stop` turns `true` (or its sender is
    /// dropped): the running calls finish, then the stream ends.
    pub fn until(mut self, mut stop: watch::Receiver<bool>) -> Self {
        self.stop = Some(Box::pin(async move {
            let _ = stop.wait_for(|stopping| *stopping).await;
        }));
        self
    }

    /// Calls running now.
    pub fn in_flight(&self) -> usize {
        self.running.len()
    }
}

// Nothing of a pipeline is ever pinned in place: `run` is only called through `&mut`, the
// running calls are pinned inside `FuturesUnordered`'s own allocations, and the incoming side is
// `Unpin` by bound. So the pipeline can move whatever `F` is.
impl<S: Unpin, F, Fut> Unpin for Pipeline<S, F, Fut> {}

impl<S, F, Fut> Stream for Pipeline<S, F, Fut>
where
    S: Stream<Item = Result<PipelineRequest, Status>> + Unpin,
    F: FnMut(PipelineRequest) -> Fut,
    Fut: Future<Output = PipelineResponse>,
{
    type Item = Result<PipelineResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(stop) = this.stop.as_mut()
            && stop.as_mut().poll(cx).is_ready()
        {
            this.stop = None;
            if this.incoming.take().is_some() {
                tracing::debug!(
                    running = this.running.len(),
                    "shutting down: pipeline reads no more calls"
                );
            }
        }
        // Take new calls while there is room. A Pending here has registered the waker.
        while this.running.len() < this.in_flight_max {
            let Some(incoming) = this.incoming.as_mut() else {
                break;
            };
            match incoming.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(call))) => this.running.push((this.run)(call)),
                Poll::Ready(Some(Err(status))) => {
                    tracing::debug!(%status, running = this.running.len(), "pipeline's incoming side failed");
                    this.incoming = None;
                    this.running = FuturesUnordered::new();
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(None) => this.incoming = None,
                Poll::Pending => break,
            }
        }
        match this.running.poll_next_unpin(cx) {
            Poll::Ready(Some(answer)) => Poll::Ready(Some(Ok(answer))),
            // Nothing running: done if the client closed its side, else wait for its next call
            // (the incoming side was polled to Pending above, so its waker is set).
            Poll::Ready(None) if this.incoming.is_none() => Poll::Ready(None),
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use lock_proto::v1::pipeline_response::Answer;
    use lock_proto::v1::{ReleaseResponse, pipeline_request::Call};
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;

    fn call(call_id: u64) -> PipelineRequest {
        PipelineRequest {
            call_id,
            timeout_ms: 0,
            call: Some(Call::Release(lock_proto::v1::ReleaseRequest::default())),
        }
    }

    /// A call that takes `call_id` milliseconds and answers `released = true`.
    async fn slow(req: PipelineRequest) -> PipelineResponse {
        tokio::time::sleep(Duration::from_millis(req.call_id)).await;
        PipelineResponse {
            call_id: req.call_id,
            answer: Some(Answer::Release(ReleaseResponse { released: true })),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_run_concurrently_and_answer_in_completion_order() {
        let incoming = futures::stream::iter([30, 10, 20].map(|id| Ok(call(id))));
        let answers: Vec<u64> = Pipeline::new(incoming, slow)
            .map(|a| a.unwrap().call_id)
            .collect()
            .await;
        assert_eq!(answers, vec![10, 20, 30]);
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_the_bound_run_at_once_and_the_rest_wait_unread() {
        let started = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel(16);
        for _ in 0..5 {
            tx.send(Ok(call(100))).await.unwrap();
        }
        let run = {
            let started = started.clone();
            move |req| {
                started.fetch_add(1, Ordering::SeqCst);
                slow(req)
            }
        };
        let mut pipeline = Pipeline::with_bound(ReceiverStream::new(rx), run, 2);
        let first = tokio::time::timeout(Duration::from_millis(50), pipeline.next()).await;
        assert!(first.is_err(), "nothing finishes within 50 ms");
        assert_eq!(started.load(Ordering::SeqCst), 2);
        assert_eq!(pipeline.in_flight(), 2);
        // Finishing two lets two more in.
        assert!(pipeline.next().await.unwrap().is_ok());
        assert!(pipeline.next().await.unwrap().is_ok());
        let _ = tokio::time::timeout(Duration::from_millis(1), pipeline.next()).await;
        assert_eq!(started.load(Ordering::SeqCst), 4);
        drop(tx);
        let rest: Vec<_> = pipeline.collect().await;
        assert_eq!(
            rest.len(),
            3,
            "the stream ends after the last call once the sender closed"
        );
        assert_eq!(started.load(Ordering::SeqCst), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn on_stop_the_running_calls_finish_and_the_stream_ends_unread() {
        let (tx, rx) = mpsc::channel(16);
        tx.send(Ok(call(100))).await.unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut pipeline = Pipeline::new(ReceiverStream::new(rx), slow).until(stop_rx);
        let nothing = tokio::time::timeout(Duration::from_millis(10), pipeline.next()).await;
        assert!(nothing.is_err());
        assert_eq!(pipeline.in_flight(), 1);
        stop_tx.send(true).unwrap();
        // Sent after the stop: never read, though the client has not closed its side.
        tx.send(Ok(call(5))).await.unwrap();
        let rest: Vec<u64> = pipeline.map(|a| a.unwrap().call_id).collect().await;
        assert_eq!(rest, vec![100]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_incoming_failure_ends_the_stream_with_that_status() {
        let incoming = futures::stream::iter(vec![
            Ok(call(50)),
            Err(Status::invalid_argument("message too large")),
            Ok(call(1)),
        ]);
        let answers: Vec<_> = Pipeline::new(incoming, slow).collect().await;
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(
            answers[0].as_ref().unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
