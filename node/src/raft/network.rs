//! The client side of the Raft transport: openraft's `RaftNetworkFactory` / `RaftNetwork` over
//! the `lockd.v1.RaftService` gRPC client, with postcard payloads.
//!
//! Owns dialing peers and turning transport failures into openraft's error kinds. Every RPC is
//! bounded by the TTL openraft passes in (`RPCOption::hard_ttl`), connections are made lazily
//! and re-made by the channel after a peer restarts. Must not interpret Raft messages: it only
//! carries them (see `raft::service` for the receiving side).
//!
//! Appends (entries and heartbeats, the hot path) travel on one long-lived `AppendStream` per
//! peer, opened on first use and dropped on any failure, timeout or cancelled call (the next
//! append opens a fresh one, so an answer can never be matched to the wrong request). A peer
//! that does not know `AppendStream` (an older lockd during a rolling upgrade) gets unary
//! `Append`s from then on. Votes and snapshot chunks stay unary: they are rare.
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
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
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
            appends: None,
            appends_unsupported: false,
        }
    }
}

/// Where an append starts: on the open stream, or by opening one with this client.
enum Start {
    Open(AppendStream),
    New(RaftServiceClient<Channel>),
}

/// An open `AppendStream` to one peer, with no answer owed: a call takes it out while its
/// request is in flight and puts it back only once the answer arrived.
#[derive(Debug)]
struct AppendStream {
    requests: mpsc::Sender<RaftPayload>,
    answers: Streaming<RaftPayload>,
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
    /// The open append stream, if any (see the module docs).
    appends: Option<AppendStream>,
    /// The peer answered `AppendStream` with UNIMPLEMENTED: send it unary appends.
    appends_unsupported: bool,
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
        let encode = || {
            postcard::to_stdvec(req)
                .map(|data| RaftPayload { data })
                .map_err(|e| CallError::Decode(format!("encoding {kind:?} request: {e}")))
        };
        let streamed = kind == RPCTypes::AppendEntries && !self.appends_unsupported;
        let response = match streamed {
            true => match self.append_streamed(encode()?, ttl).await {
                Err(CallError::Network(status)) if status.code() == tonic::Code::Unimplemented => {
                    tracing::info!(
                        target = self.target,
                        "peer does not serve AppendStream (an older lockd?); sending it unary appends"
                    );
                    self.appends_unsupported = true;
                    self.unary(kind, encode()?, ttl).await?
                }
                other => other?,
            },
            false => self.unary(kind, encode()?, ttl).await?,
        };
        postcard::from_bytes(&response.data).map_err(|e| {
            CallError::Decode(format!(
                "decoding {kind:?} answer from node {} ({} bytes): {e}",
                self.target,
                response.data.len()
            ))
        })
    }

    /// One unary call of `kind` carrying `payload`, bounded by `ttl`.
    async fn unary(
        &mut self,
        kind: RPCTypes,
        payload: RaftPayload,
        ttl: Duration,
    ) -> Result<RaftPayload, CallError> {
        let mut client = self.client()?;
        let mut request = tonic::Request::new(payload);
        request.set_timeout(ttl);
        let call = async move {
            match kind {
                RPCTypes::AppendEntries => client.append(request).await,
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::InstallSnapshot => client.snapshot(request).await,
            }
        };
        match tokio::time::timeout(ttl, call).await {
            Err(_) => Err(CallError::Timeout(ttl)),
            Ok(Err(status)) => Err(classify(status)),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    /// One append on the peer's `AppendStream`, opening it first if none is open, bounded by
    /// `ttl`. The stream is held outside `self` while the answer is owed, so a failure, a
    /// timeout or a cancelled call (openraft dropping this future) drops it and the next append
    /// opens a fresh one.
    async fn append_streamed(
        &mut self,
        payload: RaftPayload,
        ttl: Duration,
    ) -> Result<RaftPayload, CallError> {
        let start = match self.appends.take() {
            Some(open) => Start::Open(open),
            None => Start::New(self.client()?),
        };
        let exchange = async move {
            let mut stream = match start {
                Start::Open(stream) => {
                    stream.requests.send(payload).await.map_err(|_| {
                        CallError::Network(tonic::Status::unavailable("append stream closed"))
                    })?;
                    stream
                }
                Start::New(mut client) => {
                    // The first request is queued before the stream opens, so it leaves with
                    // the stream's headers instead of a round trip later.
                    let (requests, queued) = mpsc::channel(1);
                    let _ = requests.send(payload).await;
                    let answers = client
                        .append_stream(ReceiverStream::new(queued))
                        .await
                        .map_err(classify)?
                        .into_inner();
                    AppendStream { requests, answers }
                }
            };
            match stream.answers.message().await {
                Ok(Some(answer)) => Ok((answer, stream)),
                Ok(None) => Err(CallError::Unreachable(tonic::Status::unavailable(
                    "append stream ended by the peer",
                ))),
                Err(status) => Err(classify(status)),
            }
        };
        let (answer, stream) = tokio::time::timeout(ttl, exchange)
            .await
            .map_err(|_| CallError::Timeout(ttl))??;
        self.appends = Some(stream);
        Ok(answer)
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
    use std::sync::atomic::Ordering;

    use super::*;
    use openraft::Vote;
    use tokio::net::TcpListener;

    /// How long the test waits for the dialled listener to see a connection: the client dials
    /// at once on a loopback address, so seconds mean it dialled somewhere else.
    const ACCEPT_WAIT: Duration = Duration::from_secs(5);

    fn vote_request() -> VoteRequest<NodeId> {
        VoteRequest::new(Vote::new(1, 1), None)
    }

    /// A peer that answers each append with `HigherVote(Vote::new(term, 9))`, `term` being the
    /// request's, so a test can tell which request an answer belongs to.
    #[derive(Clone, Default)]
    struct FakePeer {
        /// Answer `AppendStream` with UNIMPLEMENTED, like an older lockd.
        no_streams: bool,
        /// The first stream holds its first answer this long.
        first_answer_delay: Option<Duration>,
        /// `AppendStream` calls received (answered or refused).
        streams_opened: Arc<std::sync::atomic::AtomicUsize>,
        unary_appends: Arc<std::sync::atomic::AtomicUsize>,
    }

    type Answers =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftPayload, tonic::Status>> + Send>>;

    fn answer(payload: &RaftPayload) -> RaftPayload {
        let rpc: AppendEntriesRequest<TypeConfig> = postcard::from_bytes(&payload.data).unwrap();
        let answer: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> = Ok(
            AppendEntriesResponse::HigherVote(Vote::new(rpc.vote.leader_id().term, 9)),
        );
        RaftPayload {
            data: postcard::to_stdvec(&answer).unwrap(),
        }
    }

    #[tonic::async_trait]
    impl lock_proto::v1::raft_service_server::RaftService for FakePeer {
        async fn append(
            &self,
            request: tonic::Request<RaftPayload>,
        ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
            self.unary_appends.fetch_add(1, Ordering::SeqCst);
            Ok(tonic::Response::new(answer(request.get_ref())))
        }

        type AppendStreamStream = Answers;

        async fn append_stream(
            &self,
            request: tonic::Request<tonic::Streaming<RaftPayload>>,
        ) -> Result<tonic::Response<Answers>, tonic::Status> {
            let first_stream = self.streams_opened.fetch_add(1, Ordering::SeqCst) == 0;
            if self.no_streams {
                return Err(tonic::Status::unimplemented("AppendStream"));
            }
            let mut delay = self.first_answer_delay.filter(|_| first_stream);
            let answers = futures::stream::unfold(request.into_inner(), move |mut incoming| {
                let hold = delay.take();
                async move {
                    let payload = incoming.message().await.ok()??;
                    if let Some(hold) = hold {
                        tokio::time::sleep(hold).await;
                    }
                    Some((Ok(answer(&payload)), incoming))
                }
            });
            Ok(tonic::Response::new(Box::pin(answers)))
        }

        async fn vote(
            &self,
            _: tonic::Request<RaftPayload>,
        ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
            Err(tonic::Status::unimplemented("vote"))
        }

        async fn snapshot(
            &self,
            _: tonic::Request<RaftPayload>,
        ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
            Err(tonic::Status::unimplemented("snapshot"))
        }
    }

    /// Serves `peer` on a free loopback port and returns a client of it.
    async fn client_of(peer: FakePeer) -> PeerClient {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let node = Node::new(listener.local_addr().unwrap().to_string());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(lock_proto::v1::raft_service_server::RaftServiceServer::new(
                    peer,
                ))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        NetworkFactory::new(1).new_client(2, &node).await
    }

    async fn append(client: &mut PeerClient, term: u64, ttl: Duration) -> Option<u64> {
        let rpc = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(term, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        };
        match client.append_entries(rpc, RPCOption::new(ttl)).await {
            Ok(AppendEntriesResponse::HigherVote(vote)) => Some(vote.leader_id().term),
            _ => None,
        }
    }

    const TTL: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn appends_share_one_stream_and_each_gets_its_own_answer() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        for term in 1..=20 {
            assert_eq!(append(&mut client, term, TTL).await, Some(term));
        }
        assert_eq!(peer.streams_opened.load(Ordering::SeqCst), 1);
        assert_eq!(peer.unary_appends.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn after_a_timeout_the_late_answer_is_never_taken_for_the_next_one() {
        let peer = FakePeer {
            first_answer_delay: Some(Duration::from_millis(600)),
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        assert_eq!(
            append(&mut client, 1, Duration::from_millis(200)).await,
            None
        );
        // The first stream's answer to term 1 arrives meanwhile; term 2 must get its own.
        assert_eq!(append(&mut client, 2, TTL).await, Some(2));
        assert_eq!(append(&mut client, 3, TTL).await, Some(3));
        assert_eq!(peer.streams_opened.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_cancelled_append_leaves_no_answer_owed_on_the_stream() {
        let peer = FakePeer {
            first_answer_delay: Some(Duration::from_millis(300)),
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        // openraft may drop an append future at any point; here after the request left.
        let cancelled =
            tokio::time::timeout(Duration::from_millis(100), append(&mut client, 1, TTL)).await;
        assert!(cancelled.is_err(), "the first answer is held for 300 ms");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(append(&mut client, 2, TTL).await, Some(2));
        assert_eq!(peer.streams_opened.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_peer_without_streams_gets_unary_appends_and_is_asked_once() {
        let peer = FakePeer {
            no_streams: true,
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        for term in 1..=3 {
            assert_eq!(append(&mut client, term, TTL).await, Some(term));
        }
        assert_eq!(peer.unary_appends.load(Ordering::SeqCst), 3);
        assert_eq!(peer.streams_opened.load(Ordering::SeqCst), 1);
        assert!(client.appends_unsupported);
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
