//! Test support for the client side of the Raft transport: a fake follower's `RaftService`
//! served on a loopback port, clients of it, and the appends the tests send.
//!
//! Only compiled for tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use lock_proto::v1::RaftPayload;
use lock_raft_store::{LeaderId, LogId, Node, NodeId, TypeConfig, Vote};
use openraft::base::BoxStream;
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult, VoteRequest};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{NetworkFactory, PeerClient, RpcError};
use crate::raft::StreamAnswer;

/// How long a test waits for something that should happen at once.
pub(super) const ACCEPT_WAIT: Duration = Duration::from_secs(5);

/// openraft's TTL for the streams of tests that are not about deadlines.
pub(super) const TTL: Duration = Duration::from_secs(5);

pub(super) fn vote_request() -> VoteRequest<TypeConfig> {
    VoteRequest::new(Vote::new(1, 1), None)
}

/// A follower's `AppendStream`: answers each append with a log id whose index is the
/// append's term, or holds its answers, or ends the stream after some.
#[derive(Clone, Default)]
pub(super) struct FakePeer {
    /// Read appends but never answer them.
    pub(super) silent: bool,
    /// End the stream after this many answers.
    pub(super) end_after: Option<usize>,
    /// Answer `Conflict` to an append whose `prev_log_id` has at least this index.
    pub(super) conflict_from: Option<u64>,
    pub(super) streams_opened: Arc<AtomicUsize>,
    pub(super) appends_received: Arc<AtomicUsize>,
    /// Where the node id of each `Hello` goes; without it, `Hello` is unimplemented, as on a
    /// node older than the call.
    pub(super) hellos: Option<mpsc::UnboundedSender<NodeId>>,
}

impl FakePeer {
    /// The same peer, answering each `Hello` and sending its node id to `hellos`.
    pub(super) fn on_hello(mut self, hellos: mpsc::UnboundedSender<NodeId>) -> Self {
        self.hellos = Some(hellos);
        self
    }
}

type Answers =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftPayload, tonic::Status>> + Send>>;

/// Matches an append as a follower with an empty log would: its last entry, else its
/// `prev_log_id`, else (an entry-less request with nothing before it) a log id whose index
/// is the request's term, so tests can tell the answers apart. With `conflict_from`, an
/// append whose `prev_log_id` reaches that index is a conflict.
fn answer(payload: &RaftPayload, conflict_from: Option<u64>) -> RaftPayload {
    let rpc: AppendEntriesRequest<TypeConfig> = postcard::from_bytes(&payload.data).unwrap();
    let term = rpc.vote.leader_id().term;
    let answer: StreamAnswer = match (rpc.prev_log_id, conflict_from) {
        (Some(prev), Some(from)) if prev.index >= from => {
            Ok(Err(openraft::raft::StreamAppendError::Conflict(prev)))
        }
        _ => Ok(Ok(Some(
            rpc.entries
                .last()
                .map(|e| e.log_id)
                .or(rpc.prev_log_id)
                .unwrap_or(LogId::new(LeaderId { term, node_id: 1 }, term)),
        ))),
    };
    RaftPayload {
        data: postcard::to_stdvec(&answer).unwrap(),
    }
}

#[tonic::async_trait]
impl lock_proto::v1::raft_service_server::RaftService for FakePeer {
    async fn append(
        &self,
        _: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        Err(tonic::Status::unimplemented("append"))
    }

    type AppendStreamStream = Answers;

    async fn append_stream(
        &self,
        request: tonic::Request<tonic::Streaming<RaftPayload>>,
    ) -> Result<tonic::Response<Answers>, tonic::Status> {
        self.streams_opened.fetch_add(1, Ordering::SeqCst);
        let peer = self.clone();
        let answers = futures::stream::unfold(
            (request.into_inner(), 0usize),
            move |(mut incoming, answered)| {
                let peer = peer.clone();
                async move {
                    if peer.end_after == Some(answered) {
                        return None;
                    }
                    let payload = incoming.message().await.ok()??;
                    peer.appends_received.fetch_add(1, Ordering::SeqCst);
                    if peer.silent {
                        // Keep reading (and never answering) until the client gives up.
                        while incoming.message().await.ok()?.is_some() {}
                        return None;
                    }
                    Some((
                        Ok(answer(&payload, peer.conflict_from)),
                        (incoming, answered + 1),
                    ))
                }
            },
        );
        Ok(tonic::Response::new(Box::pin(answers)))
    }

    async fn vote(
        &self,
        _: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        Err(tonic::Status::unimplemented("vote"))
    }

    async fn pre_vote(
        &self,
        _: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        Err(tonic::Status::unimplemented("pre-vote"))
    }

    async fn snapshot(
        &self,
        _: tonic::Request<tonic::Streaming<RaftPayload>>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        Err(tonic::Status::unimplemented("snapshot"))
    }

    async fn hello(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        let Some(hellos) = &self.hellos else {
            return Err(tonic::Status::unimplemented("hello"));
        };
        let from: NodeId = postcard::from_bytes(&request.get_ref().data).unwrap();
        let _ = hellos.send(from);
        Ok(tonic::Response::new(RaftPayload {
            data: postcard::to_stdvec(&()).unwrap(),
        }))
    }
}

/// Serves `peer` on `listener`.
pub(super) fn serve(listener: TcpListener, peer: FakePeer) {
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(lock_proto::v1::raft_service_server::RaftServiceServer::new(
                peer,
            ))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
}

/// Serves `peer` on a free loopback port and returns a client of it.
pub(super) async fn client_of(peer: FakePeer) -> PeerClient {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node = Node::new(listener.local_addr().unwrap().to_string());
    serve(listener, peer);
    NetworkFactory::new(1).new_client(2, &node).await
}

/// Opens and drops a heartbeat-like stream on `client`: how the open went.
pub(super) async fn try_open(client: &mut PeerClient) -> Result<(), RpcError> {
    let input = futures::stream::empty::<AppendEntriesRequest<TypeConfig>>();
    client
        .stream_append(input, RPCOption::new(TTL))
        .await
        .map(drop)
}

/// An entry-less append with nothing before it, from the leader of `term`.
pub(super) fn append_request(term: u64) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new_committed(term, 1),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    }
}

pub(super) type Requests = mpsc::UnboundedSender<AppendEntriesRequest<TypeConfig>>;
pub(super) type Results<'c> = BoxStream<'c, Result<StreamAppendResult<TypeConfig>, RpcError>>;

/// Opens an append stream on `client` with openraft's TTL `ttl`: appends go in through the
/// sender, results come out of the stream.
pub(super) async fn open_stream(client: &mut PeerClient, ttl: Duration) -> (Requests, Results<'_>) {
    let (requests, input) = mpsc::unbounded_channel();
    let answers = client
        .stream_append(
            tokio_stream::wrappers::UnboundedReceiverStream::new(input),
            RPCOption::new(ttl),
        )
        .await
        .expect("stream opens");
    (requests, answers)
}

/// Waits until `counter` reaches `n`, for at most `ACCEPT_WAIT`.
pub(super) async fn reaches(counter: &AtomicUsize, n: usize) -> bool {
    let deadline = Instant::now() + ACCEPT_WAIT;
    while counter.load(Ordering::SeqCst) < n {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

/// The log id of entry `index` in term 1.
pub(super) fn log_id(index: u64) -> LogId {
    LogId::new(
        LeaderId {
            term: 1,
            node_id: 1,
        },
        index,
    )
}

/// An append in term 1 after `prev`, with blank entries at `entries` and commit index
/// `commit`.
pub(super) fn append_after(
    prev: Option<u64>,
    entries: &[u64],
    commit: Option<u64>,
) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: prev.map(log_id),
        entries: entries
            .iter()
            .map(|&i| lock_raft_store::Entry {
                log_id: log_id(i),
                payload: lock_raft_store::EntryPayload::Blank,
            })
            .collect(),
        leader_commit: commit.map(log_id),
    }
}

/// The next `n` results of `answers`, each a matched log id's index.
pub(super) async fn matched(answers: &mut Results<'_>, n: usize) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let answer = answers.next().await.expect("an answer").expect("no error");
        out.push(answer.expect("matched").map(|id| id.index));
    }
    out
}
