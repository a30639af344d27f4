//! The API families: a tower layer on the serve loop that counts every gRPC call by service,
//! method and status code and times it from arrival to the end of its answer
//! (`lockd_grpc_requests_total`, `lockd_grpc_request_duration_seconds`), and
//! [`CallMeters`], which the `Pipeline` stream uses to count each call it carries under its
//! unary method's name. A blocking `Acquire`, unary or on a pipeline, is also observed in
//! `lockd_acquire_wait_duration_seconds`.
//!
//! Owns reading the request path and the `grpc-status` of the answer (in its headers for an
//! error answered at once, else in its trailers); decides nothing about a call. A call whose
//! answer never ended (the client went away) counts as `CANCELLED`.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::{Body, Frame, SizeHint};
use tonic::Code;

use super::families::{Families, MethodLabels, RequestLabels};

/// The lock service's full gRPC name.
const LOCK_SERVICE: &str = "lockd.v1.LockService";

/// The gRPC status code's name as Prometheus labels show it (the names of the gRPC spec).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The `(service, method)` of a gRPC path `/lockd.v1.LockService/Acquire`, borrowed from the
/// tables of the names a node serves, so counting a call allocates nothing. Any other name is
/// [`UNKNOWN`]: a label value copied from the path would let a caller sending made-up paths
/// grow the label set, and the memory of every scrape, without bound.
fn split_path(path: &str) -> (&'static str, &'static str) {
    const KNOWN: [&str; 6] = [
        "lockd.v1.LockService",
        "lockd.v1.SessionService",
        "lockd.v1.AdminService",
        "lockd.v1.RaftService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ];
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return (UNKNOWN, UNKNOWN);
    };
    let known = |names: &[&'static str], name: &str| -> &'static str {
        names
            .iter()
            .copied()
            .find(|k| *k == name)
            .unwrap_or(UNKNOWN)
    };
    (known(&KNOWN, service), known(&KNOWN_METHODS, method))
}

/// The `service` or `method` label of a call to a name this node does not serve.
const UNKNOWN: &str = "unknown";

/// The RPC names of lockd's own services (proto/lockd/v1/*.proto) and of health, borrowed by
/// [`split_path`] so that counting a call allocates nothing.
const KNOWN_METHODS: [&str; 28] = [
    "Acquire",
    "TryAcquire",
    "CancelAcquire",
    "Renew",
    "Release",
    "Inspect",
    "ForceRevoke",
    "Pipeline",
    "OpenSession",
    "Heartbeat",
    "HeartbeatBatch",
    "CloseSession",
    "LocksOf",
    "Status",
    "Init",
    "AddLearner",
    "ChangeMembership",
    "ListRevocations",
    "Append",
    "AppendStream",
    "Vote",
    "PreVote",
    "Snapshot",
    "Hello",
    "Check",
    "Watch",
    "List",
    "ServerReflectionInfo",
];

/// Counts the calls a `Pipeline` stream carries. The layer puts one into the stream's request
/// extensions; the lock service hands it to the pipeline.
#[derive(Clone, Debug)]
pub struct CallMeters {
    families: Arc<Families>,
}

impl CallMeters {
    /// Meters into `families`.
    pub fn new(families: Arc<Families>) -> Self {
        Self { families }
    }

    /// One `LockService` call named `method` answered `code` after `took`.
    pub fn record(&self, method: &'static str, code: Code, took: Duration) {
        record(
            &self.families,
            Cow::Borrowed(LOCK_SERVICE),
            Cow::Borrowed(method),
            code,
            took,
        );
    }
}

fn record(
    families: &Families,
    service: Cow<'static, str>,
    method: Cow<'static, str>,
    code: Code,
    took: Duration,
) {
    if service == LOCK_SERVICE && method == "Acquire" {
        families.acquire_wait_duration.observe(took.as_secs_f64());
    }
    let labels = MethodLabels { service, method };
    families
        .grpc_request_duration
        .get_or_create(&labels)
        .observe(took.as_secs_f64());
    families
        .grpc_requests
        .get_or_create(&RequestLabels {
            service: labels.service,
            method: labels.method,
            code: code_name(code),
        })
        .inc();
}

/// Adds [`GrpcMetricsService`] around the serve loop's routes.
#[derive(Clone, Debug)]
pub struct GrpcMetricsLayer {
    families: Arc<Families>,
}

impl GrpcMetricsLayer {
    /// Meters into `families`.
    pub fn new(families: Arc<Families>) -> Self {
        Self { families }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            families: self.families.clone(),
        }
    }
}

/// Counts and times each call of the service it wraps.
#[derive(Clone, Debug)]
pub struct GrpcMetricsService<S> {
    inner: S,
    families: Arc<Families>,
}

/// One call being metered; records itself once, when its answer ends or when it is dropped.
#[derive(Debug)]
struct Meter {
    families: Arc<Families>,
    service: Cow<'static, str>,
    method: Cow<'static, str>,
    started: Instant,
    /// The code in the answer's headers (an error answered at once), until trailers say.
    code: Option<Code>,
    recorded: bool,
}

impl Meter {
    fn finish(&mut self, code: Code) {
        if !self.recorded {
            self.recorded = true;
            record(
                &self.families,
                std::mem::take(&mut self.service),
                std::mem::take(&mut self.method),
                code,
                self.started.elapsed(),
            );
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        // Not finished by its answer's end: either an error answered in the headers alone
        // (whose empty body hyper need not poll), or a call the client abandoned.
        let code = self.code.unwrap_or(Code::Cancelled);
        self.finish(code);
    }
}

fn status_code(headers: &http::HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .map(|v| Code::from_bytes(v.as_bytes()))
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Body + Unpin,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let (service, method) = split_path(request.uri().path());
        if service == LOCK_SERVICE && method == "Pipeline" {
            request
                .extensions_mut()
                .insert(CallMeters::new(self.families.clone()));
        }
        let mut meter = Meter {
            families: self.families.clone(),
            service: Cow::Borrowed(service),
            method: Cow::Borrowed(method),
            started: Instant::now(),
            code: None,
            recorded: false,
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await;
            match response {
                Ok(response) => {
                    meter.code = status_code(response.headers());
                    Ok(response.map(|inner| MeteredBody {
                        inner,
                        meter: Some(meter),
                    }))
                }
                Err(e) => {
                    // The transport failed the call before any answer.
                    meter.finish(Code::Unknown);
                    Err(e)
                }
            }
        })
    }
}

/// An answer's body that records its call when it ends, with the trailers' `grpc-status`.
#[derive(Debug)]
pub struct MeteredBody<B> {
    inner: B,
    meter: Option<Meter>,
}

impl<B: Body + Unpin> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(meter) = this.meter.as_mut() {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(code) = frame.trailers_ref().and_then(status_code) {
                        meter.finish(code);
                    }
                }
                Poll::Ready(Some(Err(_))) => meter.finish(Code::Unknown),
                Poll::Ready(None) => {
                    let code = meter.code.unwrap_or(Code::Ok);
                    meter.finish(code);
                }
                Poll::Pending => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_service_and_method() {
        assert_eq!(
            split_path("/lockd.v1.LockService/TryAcquire"),
            ("lockd.v1.LockService", "TryAcquire")
        );
        assert_eq!(
            split_path("/lockd.v1.AdminService/ListRevocations"),
            ("lockd.v1.AdminService", "ListRevocations")
        );
        assert_eq!(split_path("/other.Svc/Do"), ("unknown", "unknown"));
        assert_eq!(split_path("/nonsense"), ("unknown", "unknown"));
    }

    #[test]
    fn code_names_are_the_grpc_spec_names() {
        assert_eq!(code_name(Code::Ok), "OK");
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
    }

    #[test]
    fn a_pipeline_call_counts_under_its_method_and_an_acquire_as_a_wait() {
        let (families, _registry) = Families::registered(true);
        let families = Arc::new(families);
        let meters = CallMeters::new(families.clone());
        meters.record("Acquire", Code::Ok, Duration::from_millis(5));
        meters.record(
            "Release",
            Code::FailedPrecondition,
            Duration::from_millis(1),
        );
        let count = |method: &'static str, code| {
            families
                .grpc_requests
                .get(&RequestLabels {
                    service: Cow::Borrowed(LOCK_SERVICE),
                    method: Cow::Borrowed(method),
                    code,
                })
                .map(|c| c.get())
        };
        assert_eq!(count("Acquire", "OK"), Some(1));
        assert_eq!(count("Release", "FAILED_PRECONDITION"), Some(1));
        assert_eq!(count("Release", "OK"), None);
        assert_eq!(families.acquire_wait_duration.count(), 1);
    }
}
