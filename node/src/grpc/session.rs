//! `lockd.v1.SessionService` over [`RaftLockStore`]: open, heartbeat, close, locks-of.
//!
//! Owns request unpacking and answer packing only; the rules live in the store.

use lock_proto::status_from_lock_error;
use lock_proto::v1::session_service_server::SessionService;
use lock_proto::v1::{
    CloseSessionRequest, CloseSessionResponse, HeartbeatRequest, HeartbeatResponse, LocksOfRequest,
    LocksOfResponse, OpenSessionRequest, OpenSessionResponse,
};
use tonic::{Request, Response, Status};

use crate::store::raft::RaftLockStore;

/// The session service of one node.
#[derive(Clone, Debug)]
pub struct SessionApi {
    store: RaftLockStore,
}

impl SessionApi {
    /// Serves `store`.
    pub fn new(store: RaftLockStore) -> Self {
        Self { store }
    }
}

fn status(err: lock_api::LockError) -> Status {
    status_from_lock_error(&err)
}

#[tonic::async_trait]
impl SessionService for SessionApi {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let r = request.into_inner();
        let (session_id, ttl_ms) = self
            .store
            .open(&r.owner_id, r.ttl_ms)
            .await
            .map_err(status)?;
        Ok(Response::new(OpenSessionResponse { session_id, ttl_ms }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let r = request.into_inner();
        let ttl = self.store.keep_alive(&r.session_id).await.map_err(status)?;
        Ok(Response::new(HeartbeatResponse {
            alive: ttl.is_some(),
            ttl_ms: ttl.unwrap_or(0),
        }))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let r = request.into_inner();
        let locks_released = self.store.close(&r.session_id).await.map_err(status)?;
        Ok(Response::new(CloseSessionResponse { locks_released }))
    }

    async fn locks_of(
        &self,
        request: Request<LocksOfRequest>,
    ) -> Result<Response<LocksOfResponse>, Status> {
        let r = request.into_inner();
        let keys = self.store.keys_of(&r.session_id).await.map_err(status)?;
        Ok(Response::new(LocksOfResponse {
            keys: keys.into_iter().collect(),
        }))
    }
}
