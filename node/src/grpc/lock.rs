//! `lockd.v1.LockService` over any [`Backend`]: acquire (with server-side waiting),
//! try-acquire, cancel, renew, release, inspect, force-revoke.
//!
//! Owns request unpacking and answer packing only; every rule lives in the backend, every
//! conversion in `convert`, every error status in `lock_proto::error`. A dropped call (the
//! client disconnected) drops the backend's future, which cancels a waiting acquire. The five
//! calls a `Pipeline` stream carries run the same work as their unary methods
//! (`LockApi::acquire_as` and the like, which answer a `LockError`; `grpc::pipeline`), without
//! a `tonic::Request` or a status in between. The caller's
//! principal (`peer::Caller`) goes to the backend with every call that presents a session, and
//! a force-revoke's operator is the authenticated caller where there is one (`grpc::revoke`).

use lock_api::LockError;
use lock_proto::v1::lock_service_server::LockService;
use lock_proto::v1::{
    AcquireRequest, AcquireResponse, CancelAcquireRequest, CancelAcquireResponse,
    ForceRevokeRequest, ForceRevokeResponse, InspectRequest, InspectResponse, PipelineRequest,
    ReleaseRequest, ReleaseResponse, RenewRequest, RenewResponse, TryAcquireRequest,
};
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use super::pipeline::{PipelineAnswers, serve_pipeline};
use super::revoke;
use super::status;
use crate::backend::Backend;
use crate::metrics::grpc::CallMeters;
use crate::peer::Caller;

/// The principal of `request`'s caller, as the backend binds sessions to it (`None` on an
/// `--insecure` node).
pub(super) fn caller_of<T>(request: &Request<T>) -> Option<String> {
    Caller::of(request).map(|c| c.principal.clone())
}

/// The lock service of one node.
#[derive(Clone, Debug)]
pub struct LockApi<B> {
    backend: B,
}

impl<B: Backend> LockApi<B> {
    /// Serves `backend`.
    pub fn new(backend: B) -> Self {
        Self { backend }
    }
}

/// A unary call's answer: its message, or the status of its error.
fn unary<M>(answer: Result<M, LockError>) -> Result<Response<M>, Status> {
    answer.map(Response::new).map_err(status)
}

/// The five calls a `Pipeline` stream carries, each as `caller` (`None` on an `--insecure`
/// node) with its failure as the [`LockError`] itself: the unary methods answer it as a status,
/// the stream as an `ErrorDetail` (`grpc::pipeline`), each converting it once.
impl<B: Backend> LockApi<B> {
    /// `Acquire`.
    pub async fn acquire_as(
        &self,
        caller: Option<&str>,
        r: AcquireRequest,
    ) -> Result<AcquireResponse, LockError> {
        let grant = self
            .backend
            .acquire(
                caller,
                &r.session_id,
                r.request_id,
                &r.key,
                r.ttl_ms,
                r.max_wait_ms,
            )
            .await?;
        Ok(AcquireResponse {
            grant: grant.map(convert::grant),
        })
    }

    /// `TryAcquire`.
    pub async fn try_acquire_as(
        &self,
        caller: Option<&str>,
        r: TryAcquireRequest,
    ) -> Result<AcquireResponse, LockError> {
        let grant = self
            .backend
            .try_acquire(caller, &r.session_id, r.request_id, &r.key, r.ttl_ms)
            .await?;
        Ok(AcquireResponse {
            grant: grant.map(convert::grant),
        })
    }

    /// `CancelAcquire`.
    pub async fn cancel_acquire_as(
        &self,
        caller: Option<&str>,
        r: CancelAcquireRequest,
    ) -> Result<CancelAcquireResponse, LockError> {
        let released_grant = self
            .backend
            .cancel_acquire(caller, &r.session_id, r.request_id, &r.key)
            .await?;
        Ok(CancelAcquireResponse { released_grant })
    }

    /// `Renew`.
    pub async fn renew_as(
        &self,
        caller: Option<&str>,
        r: RenewRequest,
    ) -> Result<RenewResponse, LockError> {
        let grant = self
            .backend
            .renew(
                caller,
                &r.session_id,
                r.request_id,
                &r.key,
                r.fencing_token,
                r.ttl_ms,
            )
            .await?;
        Ok(RenewResponse {
            grant: grant.map(convert::grant),
        })
    }

    /// `Release`.
    pub async fn release_as(
        &self,
        caller: Option<&str>,
        r: ReleaseRequest,
    ) -> Result<ReleaseResponse, LockError> {
        let released = self
            .backend
            .release(caller, &r.session_id, r.request_id, &r.key, r.fencing_token)
            .await?;
        Ok(ReleaseResponse { released })
    }
}

#[tonic::async_trait]
impl<B: Backend + std::fmt::Debug> LockService for LockApi<B> {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let caller = caller_of(&request);
        unary(
            self.acquire_as(caller.as_deref(), request.into_inner())
                .await,
        )
    }

    async fn try_acquire(
        &self,
        request: Request<TryAcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let caller = caller_of(&request);
        unary(
            self.try_acquire_as(caller.as_deref(), request.into_inner())
                .await,
        )
    }

    async fn cancel_acquire(
        &self,
        request: Request<CancelAcquireRequest>,
    ) -> Result<Response<CancelAcquireResponse>, Status> {
        let caller = caller_of(&request);
        unary(
            self.cancel_acquire_as(caller.as_deref(), request.into_inner())
                .await,
        )
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let caller = caller_of(&request);
        unary(self.renew_as(caller.as_deref(), request.into_inner()).await)
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let caller = caller_of(&request);
        unary(
            self.release_as(caller.as_deref(), request.into_inner())
                .await,
        )
    }

    async fn inspect(
        &self,
        request: Request<InspectRequest>,
    ) -> Result<Response<InspectResponse>, Status> {
        let r = request.into_inner();
        let state = self
            .backend
            .inspect(&r.key, r.leader_confirmed)
            .await
            .map_err(status)?;
        Ok(Response::new(InspectResponse {
            info: state.map(convert::lock_info),
        }))
    }

    async fn force_revoke(
        &self,
        request: Request<ForceRevokeRequest>,
    ) -> Result<Response<ForceRevokeResponse>, Status> {
        let caller = Caller::of(&request).cloned();
        let r = request.into_inner();
        let operator =
            revoke::operator(caller.as_ref(), &r.key, &r.operator, &r.reason).map_err(status)?;
        let revocation = self
            .backend
            .force_revoke(&r.key, &operator, &r.reason, r.request_id)
            .await
            .map_err(status)?;
        revoke::log(
            &revocation,
            &operator,
            &r.reason,
            r.request_id,
            caller.is_some(),
        );
        Ok(Response::new(ForceRevokeResponse {
            outcome: Some(convert::outcome(revocation)),
        }))
    }

    type PipelineStream = PipelineAnswers;

    async fn pipeline(
        &self,
        request: Request<Streaming<PipelineRequest>>,
    ) -> Result<Response<PipelineAnswers>, Status> {
        let stop = self.backend.stop_signal();
        let meters = request.extensions().get::<CallMeters>().cloned();
        // Every call on the stream is the stream's caller's: the layer checked the stream once.
        let caller = Caller::of(&request).cloned();
        Ok(Response::new(serve_pipeline(
            self.clone(),
            request.into_inner(),
            stop,
            meters,
            caller,
        )))
    }
}
