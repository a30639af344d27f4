//! The unary Raft RPCs, each one request and one answer under openraft's TTL: a vote, a
//! pre-vote, and an append on its own (`RaftNetworkV2::append_entries`, which the trait
//! requires; openraft replicates through `append_stream`, which replaces the trait's default
//! that would call it).
//!
//! Owns the gate before each (votes fail at once while the peer is not due, an append waits
//! its turn) and the deadline. Must not look inside a Raft message: the request is encoded as
//! openraft made it and the answer, `Result<Resp, RaftError>`, handed back as decoded.

use std::time::Duration;

use lock_raft_store::TypeConfig;
use openraft::error::RaftError;
use openraft::network::RPCTypes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::call_error::{CallError, classify};
use super::payload::{decode, encode};
use super::{PeerClient, RpcError};

/// The unary RPCs.
#[derive(Clone, Copy, Debug)]
pub(super) enum Unary {
    Append,
    Vote,
    PreVote,
}

impl Unary {
    fn kind(self) -> RPCTypes {
        match self {
            Unary::Append => RPCTypes::AppendEntries,
            Unary::Vote | Unary::PreVote => RPCTypes::Vote,
        }
    }
}

impl PeerClient {
    /// Sends `req` as the unary `rpc`, bounded by `ttl`, and decodes the answer
    /// `Result<Resp, RaftError>`.
    pub(super) async fn unary<Req, Resp>(
        &mut self,
        rpc: Unary,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, RpcError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        // Votes fail at once while the peer is not due: openraft sends them again at the next
        // election timeout anyway, and an election needs only the peers that are up. A unary
        // append waits, as a replication stream does.
        if let Err(err) = self.gate(matches!(rpc, Unary::Append)).await {
            return Err(self.error(rpc.kind(), err));
        }
        let call = async {
            let mut client = self.client()?;
            let mut request = tonic::Request::new(encode("request", req)?);
            request.set_timeout(ttl);
            let response = match rpc {
                Unary::Append => client.append(request).await,
                Unary::Vote => client.vote(request).await,
                Unary::PreVote => client.pre_vote(request).await,
            }
            .map_err(classify)?;
            let answer: Result<Resp, RaftError<TypeConfig>> =
                decode("answer", self.target, response.get_ref())?;
            answer.map_err(|remote| CallError::Remote(remote.to_string()))
        };
        let result = match tokio::time::timeout(ttl, call).await {
            Err(_) => Err(CallError::Timeout(ttl)),
            Ok(result) => result,
        };
        // A vote's deadline is one election interval: a busy machine alone can miss it, so a
        // timeout here does not push the peer's next attempt away.
        self.observe(&result, false);
        result.map_err(|err| self.error(rpc.kind(), err))
    }
}
