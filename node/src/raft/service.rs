//! The receiving side of the Raft transport: the `lockd.v1.RaftService` server, handing each
//! decoded openraft request to the local `Raft` and answering its postcard-encoded result.
//!
//! Owns decoding and encoding only. Bytes from the network are never trusted: a payload that
//! does not decode is answered `InvalidArgument`, never a panic. Raft's own errors travel back
//! inside the payload (`Result<Resp, RaftError>`), so the sender sees them as remote errors.

use lock_proto::v1::RaftPayload;
use lock_proto::v1::raft_service_server::RaftService;
use lock_raft_store::TypeConfig;
use openraft::Raft;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

/// The Raft transport server of one node.
#[derive(Clone)]
pub struct RaftRpc {
    raft: Raft<TypeConfig>,
}

impl std::fmt::Debug for RaftRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftRpc").finish_non_exhaustive()
    }
}

impl RaftRpc {
    /// Serves `raft`'s transport.
    pub fn new(raft: Raft<TypeConfig>) -> Self {
        Self { raft }
    }
}

fn decode<T: DeserializeOwned>(what: &str, payload: &RaftPayload) -> Result<T, Status> {
    postcard::from_bytes(&payload.data).map_err(|e| {
        Status::invalid_argument(format!(
            "{what}: payload of {} bytes does not decode: {e}",
            payload.data.len()
        ))
    })
}

fn encode<T: Serialize>(what: &str, answer: &T) -> Result<Response<RaftPayload>, Status> {
    postcard::to_stdvec(answer)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| Status::internal(format!("{what}: answer does not encode: {e}")))
}

#[tonic::async_trait]
impl RaftService for RaftRpc {
    async fn append(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode("append", request.get_ref())?;
        let answer = self.raft.append_entries(rpc).await;
        encode("append", &answer)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: VoteRequest<u64> = decode("vote", request.get_ref())?;
        let answer = self.raft.vote(rpc).await;
        encode("vote", &answer)
    }

    async fn snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode("snapshot", request.get_ref())?;
        let answer = self.raft.install_snapshot(rpc).await;
        encode("snapshot", &answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_invalid_argument_not_a_panic() {
        let payload = RaftPayload {
            data: vec![0xff; 7],
        };
        let err = decode::<AppendEntriesRequest<TypeConfig>>("append", &payload).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("append"), "{}", err.message());
    }

    #[test]
    fn vote_round_trips_through_postcard() {
        let vote = VoteRequest::<u64>::new(openraft::Vote::new(3, 2), None);
        let bytes = postcard::to_stdvec(&vote).unwrap();
        let back: VoteRequest<u64> = decode("vote", &RaftPayload { data: bytes }).unwrap();
        assert_eq!(back, vote);
    }
}
