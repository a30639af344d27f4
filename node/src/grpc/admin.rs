//! `lockd.v1.AdminService` over any [`Backend`]: this node's view of the cluster, cluster
//! initialisation and membership changes, and the force-revoke audit log a page at a time.
//!
//! Owns request unpacking and answer packing only: what a membership change means (and that a
//! stateless backend has none) is the backend's; every error status comes from
//! `lock_proto::error`. The audit log's paging (the page size, the opaque page token) is
//! `lock_proto::audit`'s; this file applies it.

use std::collections::{BTreeMap, BTreeSet};

use lock_api::LockError;
use lock_proto::audit::{PageToken, page_size};
use lock_proto::v1::admin_service_server::AdminService;
use lock_proto::v1::{
    AddLearnerRequest, AddLearnerResponse, ChangeMembershipRequest, ChangeMembershipResponse,
    InitRequest, InitResponse, ListRevocationsRequest, ListRevocationsResponse, StatusRequest,
    StatusResponse,
};
use tonic::{Request, Response, Status};

use super::convert;
use super::status;
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

    /// One page of the audit log: one record more than the page is read, so the last page
    /// says it is the last (an empty `next_page_token`) instead of leading to an empty one.
    async fn list_revocations(
        &self,
        request: Request<ListRevocationsRequest>,
    ) -> Result<Response<ListRevocationsResponse>, Status> {
        let r = request.into_inner();
        let position = PageToken::decode(&r.page_token, &r.key).map_err(status)?;
        let size = page_size(r.page_size);
        let key = Some(r.key.as_str()).filter(|k| !k.is_empty());
        let mut records = self
            .backend
            .revocations(key, position.map(|p| p.before_floor), size + 1)
            .await
            .map_err(status)?;
        let next_page_token = if records.len() > size {
            records.truncate(size);
            records
                .last()
                .map(|last| {
                    PageToken {
                        before_floor: last.new_token_floor,
                    }
                    .encode(&r.key)
                })
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(ListRevocationsResponse {
            revocations: records.into_iter().map(convert::audit_record).collect(),
            next_page_token,
        }))
    }
}
