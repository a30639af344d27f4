//! Reaching one Raft peer: which address is dialled, the channel to it, and the per-peer gate
//! asked before each attempt.
//!
//! A peer is dialled at its address in the replicated membership unless the node was started
//! with a dial override for it (`--raft-dial ID=ADDR`, see `config::RunArgs::raft_dial`): then
//! at ADDR. The override changes only where this node connects; it never changes the
//! membership, so the leader address handed to clients stays the membership's.
//!
//! The channel is made lazily on a client's first call and re-made by tonic after a peer
//! restarts. With TLS on, every connection of the channel is made by lock-tls's connector:
//! mutual TLS with this node's certificate, the peer's certificate verified against the
//! cluster's CA and the address's host, and the files on disk read anew when they changed, so
//! a reconnect after a rotation presents the new certificate. When an attempt may be made is `raft::peer_health`'s decision, by the policy of
//! `raft::backoff`; this file only asks it before an attempt and tells it how the attempt went.
//! Must not look inside a Raft message: it sees only addresses, channels and outcomes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lock_proto::v1::raft_service_client::RaftServiceClient;
use lock_raft_store::{Node, NodeId};
use lock_tls::client::{ClientTls, TlsConnector};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::PeerClient;
use super::call_error::CallError;
use crate::raft::peer_health::PeerHealth;

/// Largest Raft message, in bytes, either way. An append carries at most
/// `RAFT_PAYLOAD_ENTRIES_MAX` entries of at most `BATCH_MAX` commands of a few KiB each, and a
/// snapshot travels in chunks of [`SNAPSHOT_CHUNK_BYTES`](crate::raft::SNAPSHOT_CHUNK_BYTES);
/// 64 MiB leaves room for both while still refusing a runaway message.
pub const RAFT_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// How long dialing a peer may take before the RPC is treated as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Peer id → `host:port` to dial instead of the membership's address; empty unless the node
/// was started with `--raft-dial`.
#[derive(Clone, Debug, Default)]
pub(super) struct DialOverrides(Arc<BTreeMap<NodeId, String>>);

impl DialOverrides {
    pub(super) fn new(dial: BTreeMap<NodeId, String>) -> Self {
        Self(Arc::new(dial))
    }

    /// Where RPCs to `target`, whose membership entry is `node`, are sent.
    pub(super) fn addr(&self, target: NodeId, node: &Node) -> String {
        self.0
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.addr.clone())
    }
}

/// A client of the `RaftService` at `addr` (peer `target`'s), connecting on its first call,
/// over TLS with `tls` when given.
fn connect(
    target: NodeId,
    addr: &str,
    tls: Option<&Arc<ClientTls>>,
) -> Result<RaftServiceClient<Channel>, CallError> {
    // `http` even with TLS: the connector does the TLS itself (see lock_tls::client).
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| CallError::BadAddress(format!("peer {target} address {addr:?}: {e}")))?
        // Bounds the TCP connect and, with TLS, the handshake.
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let channel = match tls {
        None => endpoint.connect_lazy(),
        Some(tls) => endpoint.connect_with_connector_lazy(TlsConnector::new(tls.clone())),
    };
    Ok(RaftServiceClient::new(channel)
        .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX))
}

/// Tells `health` (the peer at `addr`) how an attempt went (see
/// [`CallError::counts_against_peer`]). A free function for the answer side of a stream,
/// which outlives the client's borrow.
pub(super) fn observe(
    health: &PeerHealth,
    addr: &str,
    outcome: Result<(), &CallError>,
    timeout_counts: bool,
) {
    match outcome {
        Ok(()) => health.succeeded(Instant::now()),
        Err(err) if err.counts_against_peer(timeout_counts) => {
            health.failed(Instant::now(), addr, err);
        }
        Err(_) => {}
    }
}

impl PeerClient {
    /// The client of this peer's channel, made on first use.
    pub(super) fn client(&mut self) -> Result<RaftServiceClient<Channel>, CallError> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let client = connect(self.target, &self.addr, self.tls.as_ref())?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Before an attempt: waits for the peer's turn if `wait`, else fails at once with
    /// [`CallError::NotYet`] when its turn has not come (see `Purpose`).
    pub(super) async fn gate(&self, wait: bool) -> Result<(), CallError> {
        if wait {
            self.health.wait_turn().await;
            return Ok(());
        }
        self.health.turn(Instant::now()).map_err(CallError::NotYet)
    }

    /// Tells the peer's health how an attempt went (see [`CallError::counts_against_peer`]).
    pub(super) fn observe<T>(&self, result: &Result<T, CallError>, timeout_counts: bool) {
        let outcome = result.as_ref().map(|_| ());
        observe(&self.health, &self.addr, outcome, timeout_counts);
    }
}

#[cfg(test)]
mod tests {
    use openraft::RaftNetworkFactory;
    use openraft::error::RPCError;
    use openraft::network::{RPCOption, RaftNetworkV2};
    use tokio::net::TcpListener;

    use super::super::NetworkFactory;
    use super::super::test_peer::{ACCEPT_WAIT, FakePeer, serve, try_open, vote_request};
    use super::*;
    use crate::raft::backoff::BACKOFF_INITIAL;

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
