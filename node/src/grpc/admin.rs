//! `lockd.v1.AdminService` over any [`Backend`]: this node's view of the cluster, cluster
//! initialisation and membership changes.
//!
//! Owns request unpacking and answer packing only: what a membership change means (and that a
//! stateless backend has none) is the backend's; every error status comes from
//! `lock_proto::error`.

use std::collections::{BTreeMap, BTreeSet};

use lock_api::LockError;
use lock_proto::status_from_lock_error;
use lock_proto::v1::admin_service_server::AdminService;
use lock_proto::v1::{
    AddLearnerRequest, AddLearnerResponse, ChangeMembershipRequest, ChangeMembershipResponse,
    InitRequest, InitResponse, StatusRequest, StatusResponse,
};
use tonic::{Request, Response, Status};

use super::convert;
use crate::backend::Backend;

/// The admin service of one node.
#[derive(Clone, Debug)]
pub struct AdminApi<B> {
    backend: B,
    cluster_name: String,
}

impl<B: Backend> AdminApi<B> {
    /// Serves `backend` of cluster `cluster_name`.
    pub fn new(backend: B, cluster_name: String) -> Self {
        Self {
            backend,
            cluster_name,
        }
    }
}

fn status(err: LockError) -> Status {
    status_from_lock_error(&err)
}

#[tonic::async_trait]
impl<B: Backend + std::fmt::Debug> AdminService for AdminApi<B> {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(convert::status(
            self.backend.status(),
            &self.cluster_name,
        )))
    }

    async fn init(&self, request: Request<InitRequest>) -> Result<Response<InitResponse>, Status> {
        let members: BTreeMap<u64, String> = request
            .into_inner()
            .members
            .into_iter()
            .map(|m| (m.node_id, m.addr))
            .collect();
        self.backend.init(members).await.map_err(status)?;
        Ok(Response::new(InitResponse {}))
    }

    async fn add_learner(
        &self,
        request: Request<AddLearnerRequest>,
    ) -> Result<Response<AddLearnerResponse>, Status> {
        let Some(member) = request.into_inner().member else {
            return Err(status(LockError::invalid("member is required")));
        };
        self.backend
            .add_learner(member.node_id, member.addr)
            .await
            .map_err(status)?;
        Ok(Response::new(AddLearnerResponse {}))
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> Result<Response<ChangeMembershipResponse>, Status> {
        let r = request.into_inner();
        let voters: BTreeSet<u64> = r.voter_ids.into_iter().collect();
        self.backend
            .change_membership(voters, r.retain)
            .await
            .map_err(status)?;
        Ok(Response::new(ChangeMembershipResponse {}))
    }
}
