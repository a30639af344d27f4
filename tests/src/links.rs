//! [`LinkNet`]: a TCP proxy on every ordered node-to-node link of a test cluster, so a test can
//! partition nodes without root (no iptables, no namespaces).
//!
//! Node i is started with `--raft-dial j=<proxy of i→j>` for every other node j (lockd dials
//! those addresses for Raft RPCs only; clients still reach every node directly, and the
//! membership's addresses are unchanged). The proxies are bound before the cluster's ports are
//! chosen, and learn their targets afterwards ([`LinkNet::set_targets`]), because
//! [`crate::Cluster`] picks ports itself and may pick again after a port conflict.
//!
//! A cut behaves like an iptables DROP rule, not like a refused connection (a killed node is
//! the refused case): bytes on existing connections stop in both directions and are held, and
//! a connection made while the link is cut is accepted and then blackholed, so the dialler sees
//! timeouts, never an error. A heal lets held connections flow on and closes the blackholed
//! ones, so the dialler reconnects. The proxies are lock-jepsen's [`ProxyNet`], which owns the
//! listeners, the bytes and that cut model, so the fault-injection harness and these tests
//! partition a cluster the same way.
//!
//! Owns the harness's view of that net: bound before the ports, isolating one node. Must not
//! know about Raft or decide which links to cut: tests do, through [`crate::Cluster::isolate`]
//! and [`crate::Cluster::heal`].

use std::collections::BTreeMap;

use lock_jepsen::proxy::ProxyNet;

use crate::HarnessError;

/// A proxy for every ordered pair of a cluster's nodes.
#[derive(Debug)]
pub struct LinkNet {
    /// The node ids, so [`LinkNet::isolate`] can name every link of one node.
    ids: Vec<u64>,
    net: ProxyNet,
}

impl LinkNet {
    /// Binds one proxy per ordered pair (i, j), i ≠ j, of `ids`, each on an ephemeral port of
    /// 127.0.0.1. No target is known yet: until [`LinkNet::set_targets`], a connection is
    /// closed at once, as a node that is not up yet would refuse it.
    pub async fn start(ids: &[u64]) -> Result<Self, HarnessError> {
        let net = ProxyNet::bind(ids)
            .await
            .map_err(|e| HarnessError::new(format!("cannot bind the link proxies: {e:#}")))?;
        Ok(Self {
            ids: ids.to_vec(),
            net,
        })
    }

    /// Sets every node's real `host:port` (node id → address); connections made from now on
    /// are forwarded there. A link to a node missing from `addrs` closes its connections.
    pub fn set_targets(&self, addrs: BTreeMap<u64, String>) {
        self.net.set_targets(&addrs);
    }

    /// Node `from`'s `--raft-dial` value: `j=<proxy of from→j>` for every other node j.
    pub fn raft_dial(&self, from: u64) -> String {
        self.net.raft_dial(from)
    }

    /// Cuts both directions between `id` and every other node.
    ///
    /// # Panics
    /// If `id` has no links (not a node of this net).
    pub fn isolate(&self, id: u64) {
        let pairs: Vec<(u64, u64)> = self
            .ids
            .iter()
            .filter(|&&other| other != id)
            .map(|&other| (id, other))
            .collect();
        assert!(
            self.ids.contains(&id) && !pairs.is_empty(),
            "isolate({id}): node {id} has no links in this net"
        );
        // Every pair of two ids of this net has its proxies, so this cannot fail.
        if let Err(e) = self.net.cut(&pairs) {
            panic!("isolate({id}): {e:#}");
        }
    }

    /// Heals every link.
    pub fn heal(&self) {
        self.net.heal();
    }

    /// The links cut now, as ordered pairs.
    pub fn cut_links(&self) -> Vec<(u64, u64)> {
        self.net.cut_links()
    }
}

#[cfg(test)]
mod tests {
    //! `LinkNet`'s own concerns: which proxy carries which pair, and where each forwards.
    //! What a cut does to the bytes is lock-jepsen's `proxy`'s, and tested there.

    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// How long a test waits for what must happen (loopback: microseconds).
    const ARRIVES: Duration = Duration::from_secs(5);

    fn proxy_addr(dial: &str, to: u64) -> String {
        dial.split(',')
            .find_map(|entry| entry.strip_prefix(&format!("{to}=")))
            .unwrap_or_else(|| panic!("no entry for {to} in {dial:?}"))
            .to_owned()
    }

    /// Connects to `proxy` and asserts the proxy closes the connection (no target).
    async fn assert_closed(proxy: &str) {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(ARRIVES, stream.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(matches!(closed, Ok(0) | Err(_)), "{proxy}: {closed:?}");
    }

    /// Connects to `proxy` and asserts the connection reaches `node` and carries bytes.
    async fn assert_reaches(proxy: &str, node: &TcpListener) {
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let (mut server, _) = tokio::time::timeout(ARRIVES, node.accept())
            .await
            .unwrap_or_else(|_| panic!("{proxy} did not dial its node"))
            .unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        tokio::time::timeout(ARRIVES, server.read_exact(&mut got))
            .await
            .expect("bytes arrive in time")
            .unwrap();
        assert_eq!(&got, b"ping");
    }

    #[tokio::test]
    async fn dial_values_name_every_other_node_and_isolate_cuts_exactly_its_links() {
        let net = LinkNet::start(&[1, 2, 3]).await.unwrap();
        let dial = net.raft_dial(1);
        assert!(dial.starts_with("2=127.0.0.1:"), "{dial}");
        assert!(dial.contains(",3=127.0.0.1:"), "{dial}");
        assert!(!dial.contains("1="), "{dial}");
        net.isolate(3);
        assert_eq!(net.cut_links(), vec![(1, 3), (2, 3), (3, 1), (3, 2)]);
        net.heal();
        assert!(net.cut_links().is_empty());
    }

    #[tokio::test]
    async fn each_link_forwards_to_its_own_node_once_the_targets_are_set() {
        let net = LinkNet::start(&[1, 2, 3]).await.unwrap();
        let node1 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let node2 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let one_to_two = proxy_addr(&net.raft_dial(1), 2);
        let two_to_one = proxy_addr(&net.raft_dial(2), 1);
        let one_to_three = proxy_addr(&net.raft_dial(1), 3);

        // Before the targets are known, a connection is closed.
        assert_closed(&one_to_two).await;

        // Node 3's address stays unknown, so its links go on closing.
        net.set_targets(BTreeMap::from([
            (1, node1.local_addr().unwrap().to_string()),
            (2, node2.local_addr().unwrap().to_string()),
        ]));
        assert_reaches(&one_to_two, &node2).await;
        assert_reaches(&two_to_one, &node1).await;
        assert_closed(&one_to_three).await;
    }
}
