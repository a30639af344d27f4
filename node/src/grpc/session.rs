//! `lockd.v1.SessionService` over any [`Backend`]: open, heartbeat, batched heartbeat,
//! close, locks-of.
//!
//! Owns request unpacking, answer packing and the wire limit of a `HeartbeatBatch`; the lease
//! rules (leader check, one confirmation round per batch) live in the backend.

use lock_proto::error::error_detail_from_lock_error;
use lock_proto::session::{HEARTBEAT_BATCH_REQUEST_BYTES_MAX, check_heartbeat_batch_len};
use lock_proto::v1::heartbeat_batch_result::Outcome;
use lock_proto::v1::session_service_server::SessionService;
use lock_proto::v1::{
    CloseSessionRequest, CloseSessionResponse, HeartbeatBatchRequest, HeartbeatBatchResponse,
    HeartbeatBatchResult, HeartbeatRequest, HeartbeatResponse, LocksOfRequest, LocksOfResponse,
    OpenSessionRequest, OpenSessionResponse,
};
use tonic::{Request, Response, Status};

use super::lock::caller_of;
use super::status;
use crate::backend::Backend;
use crate::grpc::CLIENT_MESSAGE_BYTES_MAX;

// A full batch must fit in one client message, or a client splitting by the batch limit
// would still be refused by the transport.
const _: () = assert!(HEARTBEAT_BATCH_REQUEST_BYTES_MAX < CLIENT_MESSAGE_BYTES_MAX);

/// The `Heartbeat` answer for a keep-alive outcome: alive with its TTL, or terminal.
fn heartbeat_answer(ttl_ms: Option<u64>) -> HeartbeatResponse {
    HeartbeatResponse {
        alive: ttl_ms.is_some(),
        ttl_ms: ttl_ms.unwrap_or(0),
    }
}

/// The session service of one node.
#[derive(Clone, Debug)]
pub struct SessionApi<B> {
    backend: B,
}

impl<B: Backend> SessionApi<B> {
    /// Serves `backend`.
    pub fn new(backend: B) -> Self {
        Self { backend }
    }
}

#[tonic::async_trait]
impl<B: Backend + std::fmt::Debug> SessionService for SessionApi<B> {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let (session_id, ttl_ms) = self
            .backend
            .open_session(caller.as_deref(), &r.owner_id, r.ttl_ms)
            .await
            .map_err(status)?;
        Ok(Response::new(OpenSessionResponse { session_id, ttl_ms }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let ttl = self
            .backend
            .keep_alive(caller.as_deref(), &r.session_id)
            .await
            .map_err(status)?;
        Ok(Response::new(heartbeat_answer(ttl)))
    }

    async fn heartbeat_batch(
        &self,
        request: Request<HeartbeatBatchRequest>,
    ) -> Result<Response<HeartbeatBatchResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        check_heartbeat_batch_len(r.session_ids.len()).map_err(status)?;
        let answers = self
            .backend
            .keep_alive_batch(caller.as_deref(), &r.session_ids)
            .await
            .map_err(status)?;
        let results = answers
            .into_iter()
            .map(|answer| HeartbeatBatchResult {
                outcome: Some(match answer {
                    Ok(ttl) => Outcome::Heartbeat(heartbeat_answer(ttl)),
                    Err(err) => Outcome::Error(error_detail_from_lock_error(&err)),
                }),
            })
            .collect();
        Ok(Response::new(HeartbeatBatchResponse { results }))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let locks_released = self
            .backend
            .close_session(caller.as_deref(), &r.session_id)
            .await
            .map_err(status)?;
        Ok(Response::new(CloseSessionResponse { locks_released }))
    }

    async fn locks_of(
        &self,
        request: Request<LocksOfRequest>,
    ) -> Result<Response<LocksOfResponse>, Status> {
        let caller = caller_of(&request);
        let r = request.into_inner();
        let keys = self
            .backend
            .locks_of(caller.as_deref(), &r.session_id)
            .await
            .map_err(status)?;
        Ok(Response::new(LocksOfResponse {
            keys: keys.into_iter().collect(),
        }))
    }
}
