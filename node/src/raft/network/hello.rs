//! The `Hello` a node sends each peer when it starts, and what receiving one does.
//!
//! A leader backs off from a follower that is down: after a few failures it tries again only
//! every 0.5–1 s (`raft::backoff`). A follower that restarts therefore waited for the leader's
//! next retry before its catch-up began, up to a second after it was listening: 0.52 s of the
//! 2.77 s a restarted node took to catch up in one W5 run (docs/PERFORMANCE.md, "Session 16").
//! Now the restarted node says hello to each peer of its membership as it starts serving, and a
//! peer that was backing off from it tries again at once ([`PeerHints::heard_from`]), and logs
//! what the hello changed.
//!
//! A hello is a hint, never a verdict. It does not mark the peer reachable (only a call of this
//! node's that gets through does), it brings the retry forward at most once per failed round
//! (`PeerHealth::heard_from`), and it changes nothing in Raft. Sending it is best effort: one
//! call per peer under a short deadline, whose failure is logged at DEBUG and otherwise
//! ignored (the leader's backoff still reaches the node, as before). An older node answers
//! `Unimplemented`, which is such a failure.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_raft_store::{Node, NodeId};
use tokio::time::Instant;

use super::call_error::{CallError, classify};
use super::payload::{decode, encode};
use super::{NetworkFactory, Purpose};
use crate::raft::peer_health::{Hinted, PeerHealth};

/// How long one hello may take: the peer is expected up and near; a peer that is not answers
/// nothing useful later either.
const HELLO_DEADLINE: Duration = Duration::from_secs(1);

/// Brings this node's next attempt to a peer forward when that peer says hello; shared with
/// the Raft service that receives the hellos. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PeerHints {
    /// The factory's map of peer id → reachability.
    health: Arc<Mutex<BTreeMap<NodeId, Arc<PeerHealth>>>>,
}

impl PeerHints {
    /// Peer `peer` said it is listening (see the module docs): brings an attempt to it that
    /// waits for its backoff forward, and logs what the hello changed, once per hello (a node
    /// says hello once per start). `None` for a peer this node has never called.
    pub fn heard_from(&self, peer: NodeId) -> Option<Hinted> {
        let health = {
            let map = self.health.lock().unwrap_or_else(|e| e.into_inner());
            map.get(&peer).cloned()
        };
        let hinted = health.map(|h| h.heard_from(Instant::now()));
        let outcome = hinted.map_or("it was never called", Hinted::as_str);
        tracing::info!(peer, outcome, "raft peer says it is listening");
        hinted
    }
}

impl NetworkFactory {
    /// The hints the Raft service gives this factory's peers when they say hello.
    pub fn hints(&self) -> PeerHints {
        PeerHints {
            health: self.health.clone(),
        }
    }

    /// Says hello to each of `peers` (id and membership entry) other than this node, all at
    /// once, each under `HELLO_DEADLINE` (1 s), and logs how many answered (INFO, once). Never
    /// fails: a peer that does not answer is logged at DEBUG; with no other peer (no
    /// membership yet) it does nothing. Returns how many answered.
    pub async fn say_hello(&self, peers: Vec<(NodeId, Node)>) -> usize {
        let others: Vec<_> = peers
            .into_iter()
            .filter(|(id, _)| *id != self.self_id)
            .collect();
        if others.is_empty() {
            tracing::debug!("no raft peers to say hello to: no membership yet");
            return 0;
        }
        let told = others.len();
        let calls = others.into_iter().map(|(target, node)| {
            let mut client = self.client(target, &node, Purpose::Replication);
            let from = self.self_id;
            async move {
                let call = async {
                    let mut grpc = client.client()?;
                    let mut request = tonic::Request::new(encode("hello", &from)?);
                    request.set_timeout(HELLO_DEADLINE);
                    let answer = grpc.hello(request).await.map_err(classify)?;
                    decode::<()>("hello answer", target, answer.get_ref())
                };
                let outcome = match tokio::time::timeout(HELLO_DEADLINE, call).await {
                    Err(_) => Err(CallError::Timeout(HELLO_DEADLINE)),
                    Ok(outcome) => outcome,
                };
                match outcome {
                    Ok(()) => {
                        // It answered: the way to it works.
                        client.observe(&Ok::<(), CallError>(()), false);
                        true
                    }
                    Err(error) => {
                        tracing::debug!(peer = target, %error, "raft hello not delivered");
                        false
                    }
                }
            }
        });
        let answered = futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|answered| *answered)
            .count();
        tracing::info!(
            peers = told,
            answered,
            "told the raft peers this node is listening"
        );
        answered
    }
}

#[cfg(test)]
mod tests {
    use openraft::RaftNetworkFactory;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::*;
    use crate::raft::network::test_peer::{FakePeer, serve};

    #[tokio::test]
    async fn a_hello_reaches_each_other_peer_with_this_nodes_id() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut peers = Vec::new();
        for id in [2, 3] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            serve(listener, FakePeer::default().on_hello(tx.clone()));
            peers.push((id, Node::new(addr)));
        }
        // Itself is skipped, and a peer that is not listening is only not counted.
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_addr = dead.local_addr().unwrap().to_string();
        drop(dead);
        peers.push((1, Node::new("127.0.0.1:1")));
        peers.push((4, Node::new(dead_addr)));
        let factory = NetworkFactory::new(1);
        assert_eq!(factory.say_hello(peers).await, 2);
        let heard = [rx.recv().await.unwrap(), rx.recv().await.unwrap()];
        assert_eq!(heard, [1, 1], "both peers heard node 1");
        assert!(rx.try_recv().is_err(), "and nobody else said hello");
    }

    #[tokio::test]
    async fn a_peers_hello_brings_only_its_own_retry_forward() {
        let mut factory = NetworkFactory::new(1);
        let hints = factory.hints();
        // Never called: nothing to bring forward.
        assert_eq!(hints.heard_from(2), None);
        // Peers 2 and 3 failed a call each: both back off.
        let _client2 = factory.new_client(2, &Node::new("127.0.0.1:1")).await;
        let _client3 = factory.new_client(3, &Node::new("127.0.0.1:1")).await;
        for peer in [2, 3] {
            factory.health(peer).failed(Instant::now(), "a", &"refused");
            assert!(factory.health(peer).turn(Instant::now()).is_err());
        }
        assert_eq!(hints.heard_from(2), Some(Hinted::BroughtForward));
        assert_eq!(factory.health(2).turn(Instant::now()), Ok(()));
        assert!(factory.health(3).turn(Instant::now()).is_err());
        // Brought forward, not reachable: only a call that gets through says so.
        assert!(!factory.health(2).is_reachable());
    }
}
