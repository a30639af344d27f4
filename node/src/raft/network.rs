//! The client side of the Raft transport: openraft's `RaftNetworkFactory` / `RaftNetwork` over
//! the `lockd.v1.RaftService` gRPC client, with postcard payloads.
//!
//! Owns dialing peers and turning transport failures into openraft's error kinds. Every RPC is
//! bounded by the TTL openraft passes in (`RPCOption::hard_ttl`), connections are made lazily
//! and re-made by the channel after a peer restarts. Must not interpret Raft messages: it only
//! carries them (see `raft::service` for the receiving side).
//!
//! A peer is dialled at its address in the replicated membership unless the node was started
//! with a dial override for it (`--raft-dial ID=ADDR`, see `config::RunArgs::raft_dial`): then
//! at ADDR. The override changes only where this node connects; it never changes the
//! membership, so the leader address handed to clients stays the membership's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lock_proto::v1::RaftPayload;
use lock_proto::v1::raft_service_client::RaftServiceClient;
use lock_raft_store::{Node, NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

/// Largest Raft message, in bytes, either way. An append carries at most
/// `RAFT_PAYLOAD_ENTRIES_MAX` entries of at most `BATCH_MAX` commands of a few KiB each, and a
/// snapshot travels in chunks of openraft's `snapshot_max_chunk_size` (3 MiB by default); 64 MiB
/// leaves room for both while still refusing a runaway message.
pub const RAFT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// How long dialing a peer may take before the RPC is treated as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long openraft waits before retrying a peer that was unreachable. openraft's default is
/// 500 ms; a restarted follower then waits up to that long for its first heartbeat, so a
/// shorter pause is kinder to failover tests while still not spinning on a dead peer.
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(200);

/// Makes one [`PeerClient`] per peer for openraft.
#[derive(Clone, Debug)]
pub struct NetworkFactory {
    /// This node's id, for openraft's timeout errors.
    self_id: NodeId,
    /// Peer id → `host:port` to dial instead of the membership's address.
    dial: Arc<BTreeMap<NodeId, String>>,
}

impl NetworkFactory {
    /// A factory for node `self_id` that dials every peer at its membership address.
    pub fn new(self_id: NodeId) -> Self {
        Self {
            self_id,
            dial: Arc::default(),
        }
    }

    /// The same factory, but Raft RPCs to each peer id in `dial` connect to its `host:port`
    /// instead of the membership's address (the membership itself is not touched).
    pub fn with_dial_overrides(mut self, dial: BTreeMap<NodeId, String>) -> Self {
        self.dial = Arc::new(dial);
        self
    }

    /// Where RPCs to `target`, whose membership entry is `node`, are sent.
    pub fn dial_addr(&self, target: NodeId, node: &Node) -> String {
        self.dial
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.addr.clone())
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        let addr = self.dial_addr(target, node);
        if addr != node.addr {
            tracing::debug!(
                target,
                membership_addr = %node.addr,
                dial_addr = %addr,
                "raft dial override"
            );
        }
        PeerClient {
            self_id: self.self_id,
            target,
            addr,
            client: None,
        }
    }
}

/// The Raft transport to one peer.
#[derive(Debug)]
pub struct PeerClient {
    self_id: NodeId,
    target: NodeId,
    /// The address dialled: the membership's, or the override for `target`.
    addr: String,
    /// Made on first use; the channel reconnects by itself after a peer restart.
    client: Option<RaftServiceClient<Channel>>,
}

/// Why one call failed, before it is phrased as an openraft error.
#[derive(Debug)]
enum CallError {
    Timeout(Duration),
    Unreachable(tonic::Status),
    BadAddress(String),
    Network(tonic::Status),
    Decode(String),
}

/// A plain error to wrap into openraft's `NetworkError` / `Unreachable`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl PeerClient {
    fn client(&mut self) -> Result<RaftServiceClient<Channel>, CallError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{}", self.addr))
            .map_err(|e| {
                CallError::BadAddress(format!("peer {} address {:?}: {e}", self.target, self.addr))
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let client = RaftServiceClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Sends `req` with `kind`, bounded by `ttl`, and decodes the answer `Result<Resp, E>`.
    async fn call<Req, Resp, E>(
        &mut self,
        kind: RPCTypes,
        req: &Req,
        ttl: Duration,
    ) -> Result<Result<Resp, E>, CallError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: DeserializeOwned,
    {
        let data = postcard::to_stdvec(req)
            .map_err(|e| CallError::Decode(format!("encoding {kind:?} request: {e}")))?;
        let mut client = self.client()?;
        let mut request = tonic::Request::new(RaftPayload { data });
        request.set_timeout(ttl);
        let call = async move {
            match kind {
                RPCTypes::AppendEntries => client.append(request).await,
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::InstallSnapshot => client.snapshot(request).await,
            }
        };
        let response = match tokio::time::timeout(ttl, call).await {
            Err(_) => return Err(CallError::Timeout(ttl)),
            Ok(Err(status)) => return Err(classify(status)),
            Ok(Ok(response)) => response.into_inner(),
        };
        postcard::from_bytes(&response.data).map_err(|e| {
            CallError::Decode(format!(
                "decoding {kind:?} answer from node {} ({} bytes): {e}",
                self.target,
                response.data.len()
            ))
        })
    }

    fn rpc_error<E: std::error::Error>(
        &self,
        kind: RPCTypes,
        err: CallError,
    ) -> RPCError<NodeId, Node, E> {
        match err {
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action: kind,
                id: self.self_id,
                target: self.target,
                timeout,
            }),
            CallError::Unreachable(status) => RPCError::Unreachable(Unreachable::new(&status)),
            CallError::BadAddress(msg) => {
                RPCError::Unreachable(Unreachable::new(&TransportError(msg)))
            }
            CallError::Network(status) => RPCError::Network(NetworkError::new(&status)),
            CallError::Decode(msg) => RPCError::Network(NetworkError::new(&TransportError(msg))),
        }
    }

    fn remote<E: std::error::Error>(&self, err: E) -> RPCError<NodeId, Node, E> {
        RPCError::RemoteError(RemoteError::new(self.target, err))
    }
}

/// A status the transport produced (connection refused, reset, DNS) means the peer is down or
/// cut off: openraft backs off. Anything else the peer itself answered.
fn classify(status: tonic::Status) -> CallError {
    match status.code() {
        tonic::Code::Unavailable => CallError::Unreachable(status),
        _ => CallError::Network(status),
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let kind = RPCTypes::AppendEntries;
        match self
            .call::<_, AppendEntriesResponse<NodeId>, RaftError<NodeId>>(
                kind,
                &rpc,
                option.hard_ttl(),
            )
            .await
        {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(remote)) => Err(self.remote(remote)),
            Err(err) => Err(self.rpc_error(kind, err)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let kind = RPCTypes::InstallSnapshot;
        match self
            .call::<_, InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>(
                kind,
                &rpc,
                option.hard_ttl(),
            )
            .await
        {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(remote)) => Err(self.remote(remote)),
            Err(err) => Err(self.rpc_error(kind, err)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let kind = RPCTypes::Vote;
        match self
            .call::<_, VoteResponse<NodeId>, RaftError<NodeId>>(kind, &rpc, option.hard_ttl())
            .await
        {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(remote)) => Err(self.remote(remote)),
            Err(err) => Err(self.rpc_error(kind, err)),
        }
    }

    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::Vote;
    use tokio::net::TcpListener;

    /// How long the test waits for the dialled listener to see a connection: the client dials
    /// at once on a loopback address, so seconds mean it dialled somewhere else.
    const ACCEPT_WAIT: Duration = Duration::from_secs(5);

    fn vote_request() -> VoteRequest<NodeId> {
        VoteRequest::new(Vote::new(1, 1), None)
    }

    #[test]
    fn the_override_wins_only_for_its_peer() {
        let factory = NetworkFactory::new(1)
            .with_dial_overrides(BTreeMap::from([(2, "127.0.0.1:9002".to_owned())]));
        let two = Node::new("127.0.0.1:7102");
        let three = Node::new("127.0.0.1:7103");
        assert_eq!(factory.dial_addr(2, &two), "127.0.0.1:9002");
        assert_eq!(factory.dial_addr(3, &three), "127.0.0.1:7103");
        let plain = NetworkFactory::new(1);
        assert_eq!(plain.dial_addr(2, &two), "127.0.0.1:7102");
    }

    #[tokio::test]
    async fn rpcs_go_to_the_override_not_to_the_membership_address() {
        let dialled = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let membership = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dial_addr = dialled.local_addr().unwrap().to_string();
        let node = Node::new(membership.local_addr().unwrap().to_string());
        let mut factory =
            NetworkFactory::new(1).with_dial_overrides(BTreeMap::from([(2, dial_addr)]));
        let mut client = factory.new_client(2, &node).await;
        // Nobody answers the RPC (the listener only accepts), so it ends in a timeout; what
        // matters is which listener it reached.
        let call = tokio::spawn(async move {
            client
                .vote(vote_request(), RPCOption::new(Duration::from_millis(300)))
                .await
        });
        let accepted = tokio::time::timeout(ACCEPT_WAIT, dialled.accept()).await;
        assert!(
            matches!(accepted, Ok(Ok(_))),
            "the override address saw no connection: {accepted:?}"
        );
        let result = call.await.unwrap();
        assert!(result.is_err(), "nobody answered, yet: {result:?}");
        let stray = tokio::time::timeout(Duration::from_millis(100), membership.accept()).await;
        assert!(stray.is_err(), "the membership address was dialled too");
    }

    #[tokio::test]
    async fn without_an_override_rpcs_go_to_the_membership_address() {
        let membership = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let node = Node::new(membership.local_addr().unwrap().to_string());
        let mut factory = NetworkFactory::new(1)
            .with_dial_overrides(BTreeMap::from([(3, "127.0.0.1:9".to_owned())]));
        let mut client = factory.new_client(2, &node).await;
        let call = tokio::spawn(async move {
            client
                .vote(vote_request(), RPCOption::new(Duration::from_millis(300)))
                .await
        });
        let accepted = tokio::time::timeout(ACCEPT_WAIT, membership.accept()).await;
        assert!(
            matches!(accepted, Ok(Ok(_))),
            "the membership address saw no connection: {accepted:?}"
        );
        assert!(call.await.unwrap().is_err());
    }
}
