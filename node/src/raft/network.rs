//! The client side of the Raft transport: openraft's `RaftNetworkFactory` / `RaftNetworkV2`
//! over the `lockd.v1.RaftService` gRPC client, with postcard payloads.
//!
//! Owns dialing peers and turning transport failures into openraft's error kinds. Connections
//! are made lazily and re-made by the channel after a peer restarts, paced per peer by
//! `raft::peer_health` while a peer is unreachable. It carries Raft messages without deciding
//! anything about them, with one exception that is Raft protocol logic and is named as such:
//! the commit-only coalescing of `Outgoing` below, which reads an append's vote, `prev_log_id`
//! and commit index (see `raft::service` for the receiving side).
//!
//! Appends (entries and heartbeats, the hot path) are **pipelined** on one `AppendStream` per
//! openraft replication session: openraft hands over a stream of requests and reads a stream of
//! results, and each request leaves as soon as openraft makes it, without waiting for the
//! answers to those before it. The follower answers in order, so the n-th answer is the n-th
//! request's. Every request must be answered within openraft's RPC TTL, but at least
//! `APPEND_ANSWER_TIMEOUT_MIN`, from the moment it was sent, or the stream fails with a
//! timeout: a partitioned or paused follower is noticed even though the stream itself never
//! times out. A commit-only request (no entries, sent only because the commit index moved) waits
//! briefly for the next append and travels inside it when that append checks the same thing
//! (`Outgoing`); one follower message and answer fewer per commit when a client works alone
//! or a hot key changes hands. Votes and pre-votes are unary; a snapshot is one client stream
//! (a header, then the bytes in chunks).
//!
//! A peer that cannot be reached is retried with capped exponential backoff on every path
//! (`raft::peer_health`, `raft::backoff`): replication streams, unary appends and snapshots wait
//! for the peer's next turn before dialling, heartbeats (which also carry openraft's leadership
//! confirmation for linearizable reads) and votes fail at once until it comes; one success on
//! any path opens the gate for all. The peer's changes of state are logged once each.
//!
//! A peer is dialled at its address in the replicated membership unless the node was started
//! with a dial override for it (`--raft-dial ID=ADDR`, see `config::RunArgs::raft_dial`): then
//! at ADDR. The override changes only where this node connects; it never changes the
//! membership, so the leader address handed to clients stays the membership's.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use lock_proto::v1::RaftPayload;
use lock_proto::v1::raft_service_client::RaftServiceClient;
use lock_raft_store::{LogId, Node, NodeId, Snapshot, SnapshotData, TypeConfig, Vote};
use openraft::OptionalSend;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::backoff::BACKOFF_INITIAL;
use super::peer_health::{NotYet, PeerHealth};
use super::{SNAPSHOT_CHUNK_BYTES, SnapshotHeader, StreamAnswer};

/// Largest Raft message, in bytes, either way. An append carries at most
/// `RAFT_PAYLOAD_ENTRIES_MAX` entries of at most `BATCH_MAX` commands of a few KiB each, and a
/// snapshot travels in chunks of [`SNAPSHOT_CHUNK_BYTES`]; 64 MiB leaves room for both while
/// still refusing a runaway message.
pub const RAFT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The slowest a snapshot transfer may go, in bytes per second, before it is given up on (see
/// `full_snapshot`): a 1 GiB snapshot, the largest accepted, gets 100 s more than openraft's
/// TTL.
const SNAPSHOT_BYTES_PER_SEC_MIN: usize = 10 * 1024 * 1024;

/// The least time an append on a stream has to be answered, counted from when it was sent.
///
/// openraft passes its heartbeat interval (50 ms by default) as the TTL of a replication stream.
/// A pipelined append can wait that long behind the follower's earlier appends and fsyncs on a
/// busy machine, and a stream that fails is restarted only after openraft's backoff: measured
/// in lock-bench, a 50 ms deadline made 1 in 20 commits stall for about 45 ms and halved W2.
/// A follower that is gone closes the connection at once; this bound is for one that is cut
/// off silently or paused (openraft's heartbeats, with their own deadline, are what depose a
/// leader that cannot reach its followers).
const APPEND_ANSWER_TIMEOUT_MIN: Duration = Duration::from_secs(2);

/// How long dialing a peer may take before the RPC is treated as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// The pause openraft's own replication backoff makes (see [`PeerClient::backoff`]). lockd's
/// per-peer backoff ([`PeerHealth`]) is what paces attempts to an unreachable peer; openraft's
/// applies only inside a stream that is already open (the first request after errors waits
/// this long), so it is kept short: it delays a returning follower's first append by this
/// much, and remains a floor should an error path ever escape the per-peer gate.
const OPENRAFT_STREAM_BACKOFF: Duration = BACKOFF_INITIAL;

type RpcError = RPCError<TypeConfig>;

/// How long a commit-only append may wait for the next append to carry it (see [`Outgoing`]).
///
/// Between two of a lone client's commands (W3) or two hand-offs of a hot key (W2) there is
/// about one client round trip, well under this; so such a request nearly always travels inside
/// the next append instead of costing its own message, follower wake-up and answer. When
/// nothing follows in time it leaves on its own: a follower learns a commit at most this much
/// later, which delays only its own apply (followers serve no reads), never a commit, an answer
/// to a client or a heartbeat.
const COMMIT_ONLY_HOLD: Duration = Duration::from_millis(5);

/// The request side of one append stream: openraft's requests in order, except that a
/// **commit-only** request is held for up to [`COMMIT_ONLY_HOLD`] and, if openraft's next
/// request would get the same answer, not sent at all but *carried* by that next request.
///
/// A commit-only request has no entries and repeats the previous request's last log id as its
/// `prev_log_id`: openraft sends one whenever the commit index moves while no new entry is
/// ready, only to tell the follower the new commit. The next request carries it when it has the
/// same vote and `prev_log_id` and a commit index at least as high: the follower checks exactly
/// what it would have checked for the held one, and learns a commit at least as new. Its
/// answer then answers both (see [`Owed::next`]).
///
/// Heartbeats come on streams of their own with one request each and are never held: the first
/// request of a stream has no previous one to repeat, and a request is never held past the end
/// of openraft's input.
struct Outgoing<S> {
    input: S,
    /// openraft ended its input.
    ended: bool,
    /// A request read from openraft that did not carry the held one; it goes next.
    lookahead: Option<AppendEntriesRequest<TypeConfig>>,
    /// A commit-only request waiting to be carried, and how many earlier ones it carries.
    held: Option<(AppendEntriesRequest<TypeConfig>, usize)>,
    /// The log id the follower matches once the last sent request succeeds; `None` before any.
    last_sent: Option<Option<LogId>>,
    /// What each sent request owes, in order, for the answer side.
    sent_tx: mpsc::UnboundedSender<Sent>,
}

impl<S> Outgoing<S>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    fn new(input: S, sent_tx: mpsc::UnboundedSender<Sent>) -> Self {
        Self {
            input,
            sent_tx,
            ended: false,
            lookahead: None,
            held: None,
            last_sent: None,
        }
    }

    async fn next_input(&mut self) -> Option<AppendEntriesRequest<TypeConfig>> {
        if self.ended {
            return None;
        }
        let next = self.input.next().await;
        self.ended = next.is_none();
        next
    }

    fn is_commit_only(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> bool {
        rpc.entries.is_empty() && self.last_sent.as_ref() == Some(&rpc.prev_log_id)
    }

    /// The next request to send and how many held commit-only requests it carries; `None` once
    /// openraft's input has ended and everything read was sent.
    ///
    /// Cancel-safe: a request read from openraft stays in `held` or `lookahead` across every
    /// await, so if the stream is dropped, [`Drop`] still reports it as owed.
    async fn next_request(&mut self) -> Option<(AppendEntriesRequest<TypeConfig>, usize)> {
        let (rpc, carried) = loop {
            if self.held.is_none() {
                let rpc = match self.lookahead.take() {
                    Some(rpc) => rpc,
                    None => self.next_input().await?,
                };
                if self.is_commit_only(&rpc) {
                    self.held = Some((rpc, 0));
                    continue;
                }
                break (rpc, 0);
            }
            let next = if self.ended {
                None
            } else {
                // Nothing following in time is the same as nothing following: the held request
                // goes on its own. `next()` is cancel-safe, so the timeout loses no request.
                tokio::time::timeout(COMMIT_ONLY_HOLD, self.next_input())
                    .await
                    .ok()
                    .flatten()
            };
            let Some((held, carried)) = self.held.take() else {
                continue;
            };
            match next {
                Some(rpc)
                    if rpc.vote == held.vote
                        && rpc.prev_log_id == held.prev_log_id
                        && rpc.leader_commit >= held.leader_commit =>
                {
                    if rpc.entries.is_empty() {
                        // Another commit-only request: it carries the held ones in turn.
                        self.held = Some((rpc, carried + 1));
                        continue;
                    }
                    break (rpc, carried + 1);
                }
                // Not the same check, or nothing followed: the held request goes first.
                next => {
                    self.lookahead = next;
                    break (held, carried);
                }
            }
        };
        self.last_sent = Some(match rpc.entries.last() {
            Some(entry) => Some(entry.log_id),
            None => rpc.prev_log_id,
        });
        Some((rpc, carried))
    }

    /// Records that `rpc`, carrying `carried` held requests, is leaving now.
    fn sent(&self, rpc: &AppendEntriesRequest<TypeConfig>, carried: usize) {
        // Nobody reads these once the answers are dropped; that is fine.
        let _ = self.sent_tx.send(Sent::Request {
            at: Instant::now(),
            carried,
            prev_log_id: rpc.prev_log_id,
        });
    }
}

impl<S> Drop for Outgoing<S> {
    /// A stream that closes (the peer ended it, or the connection broke) while requests wait
    /// here still owes openraft an answer for each: the answer side fails the first of them.
    fn drop(&mut self) {
        if self.held.is_some() || self.lookahead.is_some() {
            let _ = self.sent_tx.send(Sent::Lost);
        }
    }
}

/// What the request side owes openraft, in order.
enum Sent {
    /// A sent append owes its own answer, after those of the commit-only requests it carries.
    Request {
        /// When it left; its answer is due the stream's TTL later.
        at: Instant,
        /// Held commit-only requests it carries (see [`Outgoing`]).
        carried: usize,
        prev_log_id: Option<LogId>,
    },
    /// The stream closed with requests read from openraft but not sent.
    Lost,
}

/// The answer side of one append stream.
struct Answers {
    answers: tonic::Streaming<RaftPayload>,
    sent_rx: mpsc::UnboundedReceiver<Sent>,
    /// Answers known but not yet handed to openraft.
    owed: Option<Owed>,
    /// The peer's health and address, told when the stream fails.
    health: Arc<PeerHealth>,
    addr: String,
}

/// A follower's answer to a sent append, still to be handed out for the requests it carried and
/// then for itself.
struct Owed {
    carried: usize,
    prev_log_id: Option<LogId>,
    result: StreamAppendResult<TypeConfig>,
}

impl Owed {
    /// The next answer for openraft, and what is still owed after it.
    ///
    /// A carried commit-only request had the sent request's vote and `prev_log_id`, so the
    /// follower would have answered it the same way: a conflict or a higher vote is its answer
    /// too, and a success matched at least its `prev_log_id` (never more is claimed for it than
    /// the follower confirmed).
    fn next(self) -> (StreamAppendResult<TypeConfig>, Option<Owed>) {
        if self.carried == 0 {
            return (self.result, None);
        }
        let answer = match &self.result {
            Ok(matching) => Ok((*matching).min(self.prev_log_id)),
            Err(err) => Err(err.clone()),
        };
        let rest = Owed {
            carried: self.carried - 1,
            ..self
        };
        (answer, Some(rest))
    }
}

/// Makes one [`PeerClient`] per peer and purpose (replication, heartbeats, snapshots) for
/// openraft; the clients of one peer share its [`PeerHealth`].
#[derive(Clone, Debug)]
pub struct NetworkFactory {
    /// This node's id, for openraft's timeout errors.
    self_id: NodeId,
    /// Peer id → `host:port` to dial instead of the membership's address.
    dial: Arc<BTreeMap<NodeId, String>>,
    /// Peer id → its reachability, made on the first client to it. A peer removed from the
    /// membership keeps its entry: a few words, and nothing dials it any more.
    health: Arc<Mutex<BTreeMap<NodeId, Arc<PeerHealth>>>>,
}

impl NetworkFactory {
    /// A factory for node `self_id` that dials every peer at its membership address.
    pub fn new(self_id: NodeId) -> Self {
        Self {
            self_id,
            dial: Arc::default(),
            health: Arc::default(),
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

    /// The shared reachability of peer `target`.
    fn health(&self, target: NodeId) -> Arc<PeerHealth> {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        health
            .entry(target)
            .or_insert_with(|| Arc::new(PeerHealth::new(self.self_id, target)))
            .clone()
    }

    fn client(&self, target: NodeId, node: &Node, purpose: Purpose) -> PeerClient {
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
            purpose,
            health: self.health(target),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    /// The client openraft replicates with, and sends votes and pre-votes on.
    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        self.client(target, node, Purpose::Replication)
    }

    /// The client of heartbeats and of the leadership confirmation behind linearizable reads
    /// (openraft sends both on it): it fails at once while the peer is not due for an attempt.
    async fn new_heartbeat_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        self.client(target, node, Purpose::Heartbeat)
    }

    async fn new_snapshot_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        self.client(target, node, Purpose::Snapshot)
    }
}

/// What openraft made a [`PeerClient`] for, which decides what an append stream does while
/// its peer is unreachable and not yet due for another attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// Entries: the stream waits for the peer's turn. openraft retries a failed stream at once
    /// (see [`PeerClient::stream_append`]), so the wait is what paces it.
    Replication,
    /// Heartbeats and leadership confirmation: fail at once. openraft sends them on its own
    /// schedule under a deadline of one heartbeat interval, so a wait would only be cut short,
    /// and a confirmation round must not wait for a dead peer when the live ones are a quorum.
    Heartbeat,
    /// Snapshots: wait, as replication does.
    Snapshot,
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
    purpose: Purpose,
    /// Shared with every other client to `target`.
    health: Arc<PeerHealth>,
}

/// Why one call failed, before it is phrased as an openraft error.
#[derive(Debug)]
enum CallError {
    Timeout(Duration),
    Unreachable(tonic::Status),
    BadAddress(String),
    Network(tonic::Status),
    Decode(String),
    /// The peer's Raft could not take the request at all (it stopped, or hit a fatal error).
    Remote(String),
    /// Not attempted: the peer is unreachable and not yet due for another attempt.
    NotYet(NotYet),
}

impl CallError {
    /// Whether this failure says the peer cannot be reached, and so pushes its next attempt
    /// away ([`PeerHealth::failed`]). A timeout does only where `timeout_counts`: on a
    /// stream, whose deadline is seconds, it means the peer is cut off; on a heartbeat or a
    /// vote, whose deadline is one interval, a busy machine alone can cause it, and a peer
    /// put into backoff for that would flap in the log.
    fn counts_against_peer(&self, timeout_counts: bool) -> bool {
        match self {
            CallError::Timeout(_) => timeout_counts,
            CallError::NotYet(_) => false,
            CallError::Unreachable(_)
            | CallError::BadAddress(_)
            | CallError::Network(_)
            | CallError::Decode(_)
            | CallError::Remote(_) => true,
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Timeout(ttl) => write!(f, "no answer within {ttl:?}"),
            CallError::Unreachable(status) | CallError::Network(status) => {
                f.write_str(&status_text(status))
            }
            CallError::BadAddress(msg) | CallError::Decode(msg) | CallError::Remote(msg) => {
                f.write_str(msg)
            }
            CallError::NotYet(not_yet) => write!(
                f,
                "peer unreachable; next attempt in {} ms",
                not_yet.retry_in.as_millis()
            ),
        }
    }
}

/// A status's message and the chain of errors under it, each once: for a refused connection,
/// `transport error: tcp connect error: Connection refused (os error 111)`.
fn status_text(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        let part = err.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = err.source();
    }
    text
}

/// A plain error to wrap into openraft's `NetworkError` / `Unreachable`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

/// The unary RPCs.
#[derive(Clone, Copy, Debug)]
enum Unary {
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

fn classify(status: tonic::Status) -> CallError {
    match status.code() {
        tonic::Code::Unavailable => CallError::Unreachable(status),
        _ => CallError::Network(status),
    }
}

/// `err`, from node `self_id` to `target`, as openraft's error. A peer whose Raft has stopped
/// is as good as unreachable: openraft backs off and retries.
fn rpc_error(self_id: NodeId, target: NodeId, kind: RPCTypes, err: CallError) -> RpcError {
    match err {
        CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
            action: kind,
            id: self_id,
            target,
            timeout,
        }),
        CallError::Unreachable(status) => RPCError::Unreachable(Unreachable::new(&status)),
        CallError::BadAddress(msg) | CallError::Remote(msg) => {
            RPCError::Unreachable(Unreachable::new(&TransportError(msg)))
        }
        err @ CallError::NotYet(_) => {
            RPCError::Unreachable(Unreachable::new(&TransportError(err.to_string())))
        }
        CallError::Network(status) => RPCError::Network(NetworkError::new(&status)),
        CallError::Decode(msg) => RPCError::Network(NetworkError::new(&TransportError(msg))),
    }
}

/// [`PeerClient::observe`], for the answer side of a stream, which outlives the client's borrow.
fn observe(health: &PeerHealth, addr: &str, outcome: Result<(), &CallError>, timeout_counts: bool) {
    match outcome {
        Ok(()) => health.succeeded(Instant::now()),
        Err(err) if err.counts_against_peer(timeout_counts) => {
            health.failed(Instant::now(), addr, err);
        }
        Err(_) => {}
    }
}

fn encode<T: Serialize>(what: &str, value: &T) -> Result<RaftPayload, CallError> {
    postcard::to_stdvec(value)
        .map(|data| RaftPayload { data })
        .map_err(|e| CallError::Decode(format!("encoding {what}: {e}")))
}

fn decode<T: DeserializeOwned>(
    what: &str,
    target: NodeId,
    payload: &RaftPayload,
) -> Result<T, CallError> {
    postcard::from_bytes(&payload.data).map_err(|e| {
        CallError::Decode(format!(
            "decoding {what} from node {target} ({} bytes): {e}",
            payload.data.len()
        ))
    })
}

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

    fn error(&self, kind: RPCTypes, err: CallError) -> RpcError {
        rpc_error(self.self_id, self.target, kind, err)
    }

    /// Before an attempt: waits for the peer's turn if `wait`, else fails at once with
    /// [`CallError::NotYet`] when its turn has not come (see [`Purpose`]).
    async fn gate(&self, wait: bool) -> Result<(), CallError> {
        if wait {
            self.health.wait_turn().await;
            return Ok(());
        }
        self.health.turn(Instant::now()).map_err(CallError::NotYet)
    }

    /// Tells the peer's health how an attempt went (see [`CallError::counts_against_peer`]).
    fn observe<T>(&self, result: &Result<T, CallError>, timeout_counts: bool) {
        let outcome = result.as_ref().map(|_| ());
        observe(&self.health, &self.addr, outcome, timeout_counts);
    }

    /// Sends `req` as the unary `rpc`, bounded by `ttl`, and decodes the answer
    /// `Result<Resp, RaftError>`.
    async fn unary<Req, Resp>(
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
        self.observe(&result, false);
        result.map_err(|err| self.error(rpc.kind(), err))
    }

    /// Opens an `AppendStream` carrying `input`, and returns its answers, each bounded by `ttl`
    /// from the moment its request was sent (see the module docs).
    async fn open_append_stream<S>(
        &mut self,
        input: S,
        ttl: Duration,
    ) -> Result<
        impl Stream<Item = Result<StreamAppendResult<TypeConfig>, RpcError>> + use<S>,
        RpcError,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let kind = RPCTypes::AppendEntries;
        let (self_id, target) = (self.self_id, self.target);
        let mut client = self.client().map_err(|e| self.error(kind, e))?;
        // What each sent request owes, in order; its answer is due `ttl` after it left.
        let (sent_tx, sent_rx) = mpsc::unbounded_channel::<Sent>();
        let requests =
            futures::stream::unfold(Outgoing::new(input, sent_tx), |mut outgoing| async move {
                let (rpc, carried) = outgoing.next_request().await?;
                match encode("append", &rpc) {
                    Ok(payload) => {
                        outgoing.sent(&rpc, carried);
                        Some((payload, outgoing))
                    }
                    Err(err) => {
                        tracing::error!(
                            ?err,
                            "an append does not encode; ending the append stream"
                        );
                        None
                    }
                }
            });
        let opened = match tokio::time::timeout(ttl, client.append_stream(requests)).await {
            Err(_) => Err(CallError::Timeout(ttl)),
            Ok(Err(status)) => Err(classify(status)),
            Ok(Ok(response)) => Ok(response.into_inner()),
        };
        // A stream's deadline is seconds: a timeout here is a peer cut off, not a busy one.
        self.observe(&opened, true);
        let answers = opened.map_err(|err| self.error(kind, err))?;
        Ok(futures::stream::unfold(
            Some(Answers {
                answers,
                sent_rx,
                owed: None,
                health: self.health.clone(),
                addr: self.addr.clone(),
            }),
            move |state| async move {
                let mut state = state?;
                let owed = match state.owed.take() {
                    Some(owed) => owed,
                    None => {
                        // The request the next answer belongs to; none once openraft ended its
                        // input and every request was answered.
                        let (at, carried, prev_log_id) = match state.sent_rx.recv().await? {
                            Sent::Request {
                                at,
                                carried,
                                prev_log_id,
                            } => (at, carried, prev_log_id),
                            Sent::Lost => {
                                let err = CallError::Unreachable(tonic::Status::unavailable(
                                    "append stream closed before this append was sent",
                                ));
                                return Some((Err(rpc_error(self_id, target, kind, err)), None));
                            }
                        };
                        let answer = match tokio::time::timeout_at(
                            at + ttl,
                            state.answers.message(),
                        )
                        .await
                        {
                            Err(_) => Err(CallError::Timeout(ttl)),
                            Ok(Err(status)) => Err(classify(status)),
                            Ok(Ok(None)) => Err(CallError::Unreachable(
                                tonic::Status::unavailable("append stream ended by the peer"),
                            )),
                            Ok(Ok(Some(payload))) => {
                                decode::<StreamAnswer>("append answer", target, &payload)
                                    .and_then(|answer| answer.map_err(CallError::Remote))
                            }
                        };
                        match answer {
                            Ok(result) => Owed {
                                carried,
                                prev_log_id,
                                result,
                            },
                            // A failure is the first owed request's; the stream ends with it.
                            // The peer went away or is cut off: its next stream waits its turn.
                            Err(err) => {
                                observe(&state.health, &state.addr, Err(&err), true);
                                return Some((Err(rpc_error(self_id, target, kind, err)), None));
                            }
                        }
                    }
                };
                let (result, rest) = owed.next();
                state.owed = rest;
                // After a conflict or a higher vote the peer answers nothing more.
                let more = result.is_ok();
                Some((Ok(result), more.then_some(state)))
            },
        ))
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcError> {
        self.unary(Unary::Append, &rpc, option.hard_ttl()).await
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RpcError>>, RpcError>,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        Box::pin(async move {
            // The backoff has to be here, before the dial, and not left to openraft (issue 17).
            // openraft's `ReplicationCore::run_stream_session` (openraft 0.10.0-alpha.37,
            // src/replication/mod.rs) treats an error from this call by counting it and
            // returning to its main loop, which asks RaftCore for the payload again and calls
            // this at once; openraft's backoff sleeps only inside the request stream
            // (`StreamState::next_request`, src/replication/stream_state.rs), which tonic polls
            // only once the connection is up. Against a refused connection that loop spun at a
            // core's worth of CPU and two WARN lines per turn. Waiting for the peer's turn here
            // paces it; a heartbeat that gets through ends the wait early.
            let wait = self.purpose != Purpose::Heartbeat;
            if let Err(err) = self.gate(wait).await {
                return Err(self.error(RPCTypes::AppendEntries, err));
            }
            let ttl = option.hard_ttl().max(APPEND_ANSWER_TIMEOUT_MIN);
            let answers = self.open_append_stream(input, ttl).await?;
            Ok(Box::pin(answers) as BoxStream<'s, _>)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        self.unary(Unary::Vote, &rpc, option.hard_ttl()).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        self.unary(Unary::PreVote, &rpc, option.hard_ttl()).await
    }

    /// Sends the whole snapshot on one `Snapshot` stream: a [`SnapshotHeader`], then the bytes
    /// in chunks of [`SNAPSHOT_CHUNK_BYTES`] (made one at a time as they leave), bounded by
    /// openraft's snapshot timeout plus the time the bytes take at 10 MiB/s,
    /// and given up when openraft closes the replication.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let kind = RPCTypes::InstallSnapshot;
        let mut cancel = std::pin::pin!(cancel);
        // Wait for an unreachable peer's turn, as a replication stream does: openraft's
        // snapshot transmitter retries a failed transfer after its own backoff, which this
        // makes the floor, not the pace.
        tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            _ = self.health.wait_turn() => {}
        }
        let data_len = snapshot.snapshot.get_ref().len();
        let to_streaming = |err: RpcError| match err {
            RPCError::Timeout(e) => StreamingError::Timeout(e),
            RPCError::Unreachable(e) => StreamingError::Unreachable(e),
            RPCError::Network(e) => StreamingError::Network(e),
            RPCError::RemoteError(e) => StreamingError::Network(NetworkError::new(&e)),
        };
        let data = snapshot.snapshot.into_inner();
        // openraft's TTL (`install_snapshot_timeout`) is meant for one chunk; the whole
        // transfer (and the follower's durable write) also gets the time the bytes take at the
        // slowest rate a healthy link is expected to sustain.
        let ttl = option.hard_ttl()
            + Duration::from_secs_f64(data_len as f64 / SNAPSHOT_BYTES_PER_SEC_MIN as f64);
        let header = SnapshotHeader {
            vote,
            meta: snapshot.meta,
            len: data.len() as u64,
        };
        let header =
            encode("snapshot header", &header).map_err(|e| to_streaming(self.error(kind, e)))?;
        let chunks = data.len().div_ceil(SNAPSHOT_CHUNK_BYTES);
        let body = (0..chunks).map(move |i| {
            let end = data.len().min((i + 1) * SNAPSHOT_CHUNK_BYTES);
            RaftPayload {
                data: data[i * SNAPSHOT_CHUNK_BYTES..end].to_vec(),
            }
        });
        let messages = futures::stream::iter(std::iter::once(header).chain(body));
        let mut client = self
            .client()
            .map_err(|e| to_streaming(self.error(kind, e)))?;
        let mut request = tonic::Request::new(messages);
        request.set_timeout(ttl);
        let target = self.target;
        let call = async move {
            let response = client.snapshot(request).await.map_err(classify)?;
            decode::<Result<SnapshotResponse<TypeConfig>, String>>(
                "snapshot answer",
                target,
                response.get_ref(),
            )?
            .map_err(CallError::Remote)
        };
        let answer = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            answer = tokio::time::timeout(ttl, call) => match answer {
                Err(_) => Err(CallError::Timeout(ttl)),
                Ok(answer) => answer,
            },
        };
        self.observe(&answer, true);
        answer.map_err(|e| to_streaming(self.error(kind, e)))
    }

    /// openraft's own backoff, which it applies inside an open stream after errors and
    /// between snapshot retries: short, because the per-peer gate already paced the attempt
    /// (see `OPENRAFT_STREAM_BACKOFF`).
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(std::iter::repeat(OPENRAFT_STREAM_BACKOFF)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use lock_raft_store::{LeaderId, LogId};
    use tokio::net::TcpListener;

    use crate::raft::backoff::BACKOFF_INITIAL;

    const ACCEPT_WAIT: Duration = Duration::from_secs(5);

    fn vote_request() -> VoteRequest<TypeConfig> {
        VoteRequest::new(Vote::new(1, 1), None)
    }

    /// A follower's `AppendStream`: answers each append with a log id whose index is the
    /// append's term, or holds its answers, or ends the stream after some.
    #[derive(Clone, Default)]
    struct FakePeer {
        /// Read appends but never answer them.
        silent: bool,
        /// End the stream after this many answers.
        end_after: Option<usize>,
        /// Answer `Conflict` to an append whose `prev_log_id` has at least this index.
        conflict_from: Option<u64>,
        streams_opened: Arc<AtomicUsize>,
        appends_received: Arc<AtomicUsize>,
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
    }

    /// Serves `peer` on `listener`.
    fn serve(listener: TcpListener, peer: FakePeer) {
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(lock_proto::v1::raft_service_server::RaftServiceServer::new(
                    peer,
                ))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
    }

    /// Serves `peer` on a free loopback port and returns a client of it.
    async fn client_of(peer: FakePeer) -> PeerClient {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let node = Node::new(listener.local_addr().unwrap().to_string());
        serve(listener, peer);
        NetworkFactory::new(1).new_client(2, &node).await
    }

    /// Opens and drops a heartbeat-like stream on `client`: how the open went.
    async fn try_open(client: &mut PeerClient) -> Result<(), RpcError> {
        let input = futures::stream::empty::<AppendEntriesRequest<TypeConfig>>();
        client
            .stream_append(input, RPCOption::new(TTL))
            .await
            .map(drop)
    }

    #[tokio::test]
    async fn a_refused_peer_is_retried_after_a_backoff_and_reached_again_when_it_listens() {
        // A port nobody listens on: connections are refused at once.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let node = Node::new(addr.to_string());
        let mut factory = NetworkFactory::new(1);
        let mut replication = factory.new_client(2, &node).await;
        let mut heartbeat = factory.new_heartbeat_client(2, &node).await;

        // Read before the first attempt: its failure, and so its retry time, is later.
        let first_attempt = Instant::now();
        let refused = try_open(&mut replication).await;
        assert!(
            matches!(&refused, Err(RPCError::Unreachable(e)) if e.to_string().contains("refused")),
            "{refused:?}"
        );
        assert!(!replication.health.is_reachable());
        // The heartbeat client shares the peer's schedule: it is not due, so it fails without
        // dialling.
        let not_due = try_open(&mut heartbeat).await;
        assert!(
            matches!(&not_due, Err(RPCError::Unreachable(e)) if e.to_string().contains("next attempt in")),
            "{not_due:?}"
        );
        // openraft calls again at once; the call waits out the first delay before dialling.
        let again = try_open(&mut replication).await;
        assert!(matches!(again, Err(RPCError::Unreachable(_))), "{again:?}");
        assert!(
            first_attempt.elapsed() >= BACKOFF_INITIAL / 2,
            "retried after {:?}",
            first_attempt.elapsed()
        );

        // The peer comes back on the same address. Heartbeats probe when due; once one gets
        // through, the replication stream opens without waiting out its delay.
        serve(TcpListener::bind(addr).await.unwrap(), FakePeer::default());
        let deadline = Instant::now() + ACCEPT_WAIT;
        while try_open(&mut heartbeat).await.is_err() {
            assert!(Instant::now() < deadline, "the heartbeat never got through");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(replication.health.is_reachable());
        assert_eq!(replication.health.turn(Instant::now()), Ok(()));
        try_open(&mut replication)
            .await
            .expect("the replication stream opens");
    }

    fn append_request(term: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(term, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        }
    }

    const TTL: Duration = Duration::from_secs(5);

    type Requests = mpsc::UnboundedSender<AppendEntriesRequest<TypeConfig>>;
    type Results<'c> = BoxStream<'c, Result<StreamAppendResult<TypeConfig>, RpcError>>;

    /// Opens an append stream on `client` with openraft's TTL `ttl`: appends go in through the
    /// sender, results come out of the stream.
    async fn open_stream(client: &mut PeerClient, ttl: Duration) -> (Requests, Results<'_>) {
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
    async fn reaches(counter: &AtomicUsize, n: usize) -> bool {
        let deadline = Instant::now() + ACCEPT_WAIT;
        while counter.load(Ordering::SeqCst) < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    #[tokio::test]
    async fn appends_leave_before_earlier_ones_are_answered_and_answers_come_in_order() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        for term in 1..=20 {
            requests.send(append_request(term)).unwrap();
        }
        // All twenty reach the peer while no answer has been read: they are pipelined.
        assert!(reaches(&peer.appends_received, 20).await);
        let terms: Vec<_> = (1..=20).map(Some).collect();
        assert_eq!(matched(&mut answers, 20).await, terms);
        drop(requests);
        assert!(answers.next().await.is_none(), "input ended, all answered");
        assert_eq!(peer.streams_opened.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_unanswered_append_times_out_and_ends_the_stream() {
        let peer = FakePeer {
            silent: true,
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        // openraft's TTL is short; the answer is still given the floor.
        let ttl = APPEND_ANSWER_TIMEOUT_MIN;
        let (requests, mut answers) = open_stream(&mut client, Duration::from_millis(50)).await;
        // Idle time before a request is not counted against it.
        tokio::time::sleep(ttl + Duration::from_millis(200)).await;
        let sent = Instant::now();
        requests.send(append_request(1)).unwrap();
        let answer = answers.next().await.expect("an item");
        assert!(matches!(answer, Err(RPCError::Timeout(_))), "{answer:?}");
        assert!(
            sent.elapsed() >= ttl,
            "timed out early: {:?}",
            sent.elapsed()
        );
        assert!(answers.next().await.is_none(), "a failed stream ends");
    }

    #[tokio::test]
    async fn a_stream_the_peer_ends_fails_the_append_it_owed() {
        let peer = FakePeer {
            end_after: Some(1),
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_request(1)).unwrap();
        requests.send(append_request(2)).unwrap();
        assert_eq!(matched(&mut answers, 1).await, [Some(1)]);
        let second = answers.next().await.expect("an item");
        assert!(
            matches!(second, Err(RPCError::Unreachable(_))),
            "{second:?}"
        );
        assert!(answers.next().await.is_none());
    }

    /// The log id of entry `index` in term 1.
    fn log_id(index: u64) -> LogId {
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
    fn append_after(
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
    async fn matched(answers: &mut Results<'_>, n: usize) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        for _ in 0..n {
            let answer = answers.next().await.expect("an answer").expect("no error");
            out.push(answer.expect("matched").map(|id| id.index));
        }
        out
    }

    #[tokio::test]
    async fn a_commit_only_append_rides_in_the_next_append_and_both_are_answered_in_order() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_after(None, &[1], None)).unwrap();
        // The commit moved and nothing new was written: openraft's commit-only request...
        requests.send(append_after(Some(1), &[], Some(1))).unwrap();
        // ...and the next entries, with the same check and a commit at least as new.
        requests.send(append_after(Some(1), &[2], Some(1))).unwrap();
        assert_eq!(matched(&mut answers, 3).await, [Some(1), Some(1), Some(2)]);
        assert_eq!(
            peer.appends_received.load(Ordering::SeqCst),
            2,
            "the commit-only request travelled inside the next append"
        );
    }

    #[tokio::test]
    async fn a_commit_only_append_with_nothing_after_it_leaves_on_its_own() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_after(None, &[1], None)).unwrap();
        requests.send(append_after(Some(1), &[], Some(1))).unwrap();
        // The input stays open and idle: the hold runs out and the request is sent.
        assert_eq!(matched(&mut answers, 2).await, [Some(1), Some(1)]);
        assert!(reaches(&peer.appends_received, 2).await);
    }

    #[tokio::test]
    async fn a_commit_only_append_goes_first_when_the_next_append_checks_something_else() {
        let peer = FakePeer::default();
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_after(None, &[1], None)).unwrap();
        requests.send(append_after(Some(1), &[], Some(1))).unwrap();
        // A lower commit index than the held request's: it cannot carry it.
        requests.send(append_after(Some(1), &[2], None)).unwrap();
        assert_eq!(matched(&mut answers, 3).await, [Some(1), Some(1), Some(2)]);
        assert_eq!(peer.appends_received.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_conflict_on_the_carrying_append_is_the_carried_requests_answer_and_ends_the_stream()
    {
        let peer = FakePeer {
            conflict_from: Some(1),
            ..FakePeer::default()
        };
        let mut client = client_of(peer.clone()).await;
        let (requests, mut answers) = open_stream(&mut client, TTL).await;
        requests.send(append_after(None, &[1], None)).unwrap();
        requests.send(append_after(Some(1), &[], Some(1))).unwrap();
        requests
            .send(append_after(Some(1), &[2, 3], Some(1)))
            .unwrap();
        assert_eq!(matched(&mut answers, 1).await, [Some(1)]);
        let carried = answers.next().await.expect("an answer").expect("no error");
        assert_eq!(
            carried,
            Err(openraft::raft::StreamAppendError::Conflict(log_id(1)))
        );
        assert!(answers.next().await.is_none(), "nothing after a conflict");
        assert_eq!(peer.appends_received.load(Ordering::SeqCst), 2);
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
