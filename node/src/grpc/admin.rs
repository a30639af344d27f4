//! `lockd.v1.AdminService`: this node's view of the cluster, cluster initialisation and
//! membership changes, straight from and to openraft.
//!
//! Owns unpacking and openraft error mapping for admin calls. Membership calls need the leader;
//! elsewhere they answer `NotLeader` through `lock_proto::error`, like every other call.

use std::collections::{BTreeMap, BTreeSet};

use lock_api::LockError;
use lock_proto::status_from_lock_error;
use lock_proto::v1::admin_service_server::AdminService;
use lock_proto::v1::{
    AddLearnerRequest, AddLearnerResponse, ChangeMembershipRequest, ChangeMembershipResponse,
    InitRequest, InitResponse, StatusRequest, StatusResponse,
};
use lock_raft_store::TypeConfig;
use openraft::BasicNode;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use tonic::{Request, Response, Status};

use super::convert;
use crate::proposer::not_leader;
use crate::store::raft::RaftLockStore;

/// The admin service of one node.
#[derive(Clone, Debug)]
pub struct AdminApi {
    store: RaftLockStore,
    cluster_name: String,
}

impl AdminApi {
    /// Serves `store` of cluster `cluster_name`.
    pub fn new(store: RaftLockStore, cluster_name: String) -> Self {
        Self {
            store,
            cluster_name,
        }
    }
}

fn write_error(err: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> Status {
    match err {
        RaftError::APIError(
            ClientWriteError::ForwardToLeader(f) | ClientWriteError::LogEntryDiscarded(f),
        ) => status_from_lock_error(&not_leader(f)),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => status_from_lock_error(
            &LockError::invalid(format!("membership change refused: {e}")),
        ),
        RaftError::APIError(ClientWriteError::PreconditionFailed(e)) => {
            status_from_lock_error(&LockError::contention(format!("write refused: {e}")))
        }
        RaftError::Fatal(f) => {
            status_from_lock_error(&LockError::contention(format!("raft is stopped: {f}")))
        }
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let metrics = self.store.raft().metrics();
        let status = convert::status(&metrics.borrow_watched(), &self.cluster_name);
        Ok(Response::new(status))
    }

    async fn init(&self, request: Request<InitRequest>) -> Result<Response<InitResponse>, Status> {
        let members: BTreeMap<u64, BasicNode> = request
            .into_inner()
            .members
            .into_iter()
            .map(|m| (m.node_id, BasicNode { addr: m.addr }))
            .collect();
        if !members.contains_key(&self.store.node_id()) {
            return Err(status_from_lock_error(&LockError::invalid(format!(
                "members must include the node that receives Init (node {})",
                self.store.node_id()
            ))));
        }
        match self.store.raft().initialize(members).await {
            Ok(()) => Ok(Response::new(InitResponse {})),
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => Err(
                status_from_lock_error(&LockError::invalid(format!("already initialised: {e}"))),
            ),
            Err(RaftError::APIError(InitializeError::NotInMembers(e))) => {
                Err(status_from_lock_error(&LockError::invalid(e.to_string())))
            }
            Err(RaftError::Fatal(f)) => Err(status_from_lock_error(&LockError::contention(
                format!("raft is stopped: {f}"),
            ))),
        }
    }

    async fn add_learner(
        &self,
        request: Request<AddLearnerRequest>,
    ) -> Result<Response<AddLearnerResponse>, Status> {
        let Some(member) = request.into_inner().member else {
            return Err(status_from_lock_error(&LockError::invalid(
                "member is required",
            )));
        };
        self.store
            .leader_check()
            .map_err(|e| status_from_lock_error(&e))?;
        self.store
            .raft()
            .add_learner(member.node_id, BasicNode { addr: member.addr }, true)
            .await
            .map_err(write_error)?;
        Ok(Response::new(AddLearnerResponse {}))
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> Result<Response<ChangeMembershipResponse>, Status> {
        let r = request.into_inner();
        let voters: BTreeSet<u64> = r.voter_ids.into_iter().collect();
        if voters.is_empty() {
            return Err(status_from_lock_error(&LockError::invalid(
                "voter_ids must not be empty",
            )));
        }
        self.store
            .leader_check()
            .map_err(|e| status_from_lock_error(&e))?;
        self.store
            .raft()
            .change_membership(voters, r.retain)
            .await
            .map_err(write_error)?;
        Ok(Response::new(ChangeMembershipResponse {}))
    }
}
