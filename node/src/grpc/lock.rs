//! `lockd.v1.LockService` over any [`Backend`]: acquire (with server-side waiting),
//! try-acquire, cancel, renew, release, inspect, force-revoke.
//!
//! Owns request unpacking and answer packing only; every rule lives in the backend, every
//! conversion in `convert`, every error status in `lock_proto::error`. A dropped call (the
//! client disconnected) drops the backend's future, which cancels a waiting acquire. The calls of
//! a `Pipeline` stream run through these same unary methods (`grpc::pipeline`). The caller's
//! principal (`peer::Caller`) goes to the backend with every call that presents a session, and
//! a force-revoke's operator is the authenticated caller where there is one (`grpc::revoke`).

use lock_proto::status_from_lock_error;
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

fn status(err: lock_api::LockError) -> Status {
    status_from_lock_error(&err)
}

#[tonic::async_trait]
impl<B: Backend + std::fmt::Debug> LockService for LockApi<B> {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let grant = self
            .backend
            .acquire(
                caller.as_deref(),
                &r.session_id,
                r.request_id,
                &r.key,
                r.ttl_ms,
                r.max_wait_ms,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(AcquireResponse {
            grant: grant.map(convert::grant),
        }))
    }

    async fn try_acquire(
        &self,
        request: Request<TryAcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let grant = self
            .backend
            .try_acquire(
                caller.as_deref(),
                &r.session_id,
                r.request_id,
                &r.key,
                r.ttl_ms,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(AcquireResponse {
            grant: grant.map(convert::grant),
        }))
    }

    async fn cancel_acquire(
        &self,
        request: Request<CancelAcquireRequest>,
    ) -> Result<Response<CancelAcquireResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let released_grant = self
            .backend
            .cancel_acquire(caller.as_deref(), &r.session_id, r.request_id, &r.key)
            .await
            .map_err(status)?;
        Ok(Response::new(CancelAcquireResponse { released_grant }))
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let grant = self
            .backend
            .renew(
                caller.as_deref(),
                &r.session_id,
                r.request_id,
                &r.key,
                r.fencing_token,
                r.ttl_ms,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(RenewResponse {
            grant: grant.map(convert::grant),
        }))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let released = self
            .backend
            .release(
                caller.as_deref(),
                &r.session_id,
                r.request_id,
                &r.key,
                r.fencing_token,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(ReleaseResponse { released }))
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
