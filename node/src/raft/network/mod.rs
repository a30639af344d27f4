//! The client side of the Raft transport: openraft's `RaftNetworkFactory` / `RaftNetworkV2`
//! over the `lockd.v1.RaftService` gRPC client, with postcard payloads.
//!
//! This file owns the factory openraft asks for clients ([`NetworkFactory`]) and the per-peer
//! connection object it calls ([`PeerClient`]), whose `RaftNetworkV2` methods only hand each
//! call to the file that owns its kind:
//!
//! - `dial`: where a peer is dialled (the membership's address or a `--raft-dial` override),
//!   the lazily made channel (mutual TLS when the node has TLS on), and the per-peer gate of `raft::peer_health` before each attempt;
//! - `unary`: appends, votes and pre-votes as one request and one answer each;
//! - `append_stream`: the pipelined appends of one replication session on one `AppendStream`;
//! - `coalesce`: the commit-only coalescing of the requests on an append stream, and the
//!   answers it owes for them;
//! - `snapshot`: a whole snapshot on one `Snapshot` stream;
//! - `hello`: at start, telling each peer once that this node listens, and on receipt of a
//!   peer's, bringing this node's next attempt to it forward ([`PeerHints`]);
//! - `call_error` and `payload`: why a call failed, as openraft's error kinds, and the
//!   postcard encoding of what goes out and comes back.
//!
//! The transport carries Raft messages without deciding anything about them, with one
//! exception that is Raft protocol logic and is kept apart as such: `coalesce`, which reads an
//! append's entries, vote, `prev_log_id` and commit index to decide which requests can travel
//! inside the next one, and derives their answers from the one that carried them (see
//! `raft::service` for the receiving side). Elsewhere a message is only encoded, decoded and
//! handed on; the one other look is `append_stream` ending a stream after an answer that is not
//! a match, as openraft's stream contract says.
//!
//! A peer that cannot be reached is retried with capped exponential backoff on every path
//! (`raft::peer_health`, `raft::backoff`): replication streams, unary appends and snapshots wait
//! for the peer's next turn before dialling, heartbeats (which also carry openraft's leadership
//! confirmation for linearizable reads) and votes fail at once until it comes; one success on
//! any path opens the gate for all, and so does, once per failed round, the peer's `Hello`
//! when it starts. The peer's changes of state are logged once each.

mod append_stream;
mod call_error;
mod coalesce;
mod dial;
mod hello;
mod payload;
mod snapshot;
#[cfg(test)]
mod test_peer;
mod unary;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::Stream;
use lock_proto::v1::raft_service_client::RaftServiceClient;
use lock_raft_store::{Node, NodeId, Snapshot, SnapshotData, TypeConfig, Vote};
use lock_tls::client::ClientTls;
use openraft::OptionalSend;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{RPCError, ReplicationClosed, StreamingError};
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use tonic::transport::Channel;

pub use dial::RAFT_MESSAGE_BYTES_MAX;
pub use hello::PeerHints;

use super::backoff::BACKOFF_INITIAL;
use super::peer_health::PeerHealth;
use dial::DialOverrides;
use unary::Unary;

/// The pause openraft's own replication backoff makes (see [`PeerClient::backoff`]). lockd's
/// per-peer backoff ([`PeerHealth`]) is what paces attempts to an unreachable peer; openraft's
/// applies only inside a stream that is already open (the first request after errors waits
/// this long), so it is kept short: it delays a returning follower's first append by this
/// much, and remains a floor should an error path ever escape the per-peer gate.
const OPENRAFT_STREAM_BACKOFF: std::time::Duration = BACKOFF_INITIAL;

/// openraft's error for one RPC of lockd's type config.
type RpcError = RPCError<TypeConfig>;

/// Makes one [`PeerClient`] per peer and purpose (replication, heartbeats, snapshots) for
/// openraft; the clients of one peer share its [`PeerHealth`].
#[derive(Clone, Debug)]
pub struct NetworkFactory {
    /// This node's id, for openraft's timeout errors.
    self_id: NodeId,
    /// Where each peer is dialled when that is not its membership address.
    dial: DialOverrides,
    /// Mutual TLS to every peer with this node's certificate (`None`: plaintext, `--insecure`).
    tls: Option<Arc<ClientTls>>,
    /// Peer id → its reachability, made on the first client to it. A peer removed from the
    /// membership keeps its entry: a few words, and nothing dials it any more.
    health: Arc<Mutex<BTreeMap<NodeId, Arc<PeerHealth>>>>,
}

impl NetworkFactory {
    /// A factory for node `self_id` that dials every peer at its membership address.
    pub fn new(self_id: NodeId) -> Self {
        Self {
            self_id,
            dial: DialOverrides::default(),
            tls: None,
            health: Arc::default(),
        }
    }

    /// The same factory, but Raft RPCs to each peer id in `dial` connect to its `host:port`
    /// instead of the membership's address (the membership itself is not touched).
    pub fn with_dial_overrides(mut self, dial: BTreeMap<NodeId, String>) -> Self {
        self.dial = DialOverrides::new(dial);
        self
    }

    /// The same factory, dialling every peer over TLS with `tls` (this node's certificate, the
    /// cluster's CA), taken anew for each new connection; `None` keeps plaintext.
    pub fn with_tls(mut self, tls: Option<Arc<ClientTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// Where RPCs to `target`, whose membership entry is `node`, are sent.
    pub fn dial_addr(&self, target: NodeId, node: &Node) -> String {
        self.dial.addr(target, node)
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
            tls: self.tls.clone(),
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
    /// (see `PeerClient::append_stream`), so the wait is what paces it.
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
    /// TLS to the peer, if on.
    tls: Option<Arc<ClientTls>>,
    /// Made on first use; the channel reconnects by itself after a peer restart.
    client: Option<RaftServiceClient<Channel>>,
    purpose: Purpose,
    /// Shared with every other client to `target`.
    health: Arc<PeerHealth>,
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
            let answers = self.append_stream(input, option).await?;
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

    /// Sends the whole snapshot on one `Snapshot` stream (see `PeerClient::send_snapshot`),
    /// given up when openraft closes the replication.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.send_snapshot(vote, snapshot, cancel, option).await
    }

    /// openraft's own backoff, which it applies inside an open stream after errors and
    /// between snapshot retries: short, because the per-peer gate already paced the attempt
    /// (see `OPENRAFT_STREAM_BACKOFF`).
    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(std::iter::repeat(OPENRAFT_STREAM_BACKOFF)))
    }
}
