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
//! ones, so the dialler reconnects. The same model as `lock-jepsen`'s proxy network.
//!
//! Owns the listeners and the bytes. Must not know about Raft or decide which links to cut:
//! tests do, through [`crate::Cluster::isolate`] and [`crate::Cluster::heal`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::HarnessError;

/// Bytes read from one side before they are written to the other: a Raft append of a few dozen
/// entries fits in a few reads, and a small buffer bounds what a cut holds per connection.
const COPY_BUF_BYTES: usize = 16 * 1024;

/// How long the proxy may take to reach its target node. A live node on loopback accepts in
/// microseconds and a killed one refuses at once; only a paused node with a full backlog
/// makes a connect hang, and then lockd's own dial timeout decides first.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next, so a lasting
/// failure does not spin a core of the test process.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Node id → the `host:port` its proxies forward to; empty until [`LinkNet::set_targets`].
type Targets = Arc<RwLock<BTreeMap<u64, String>>>;

/// One link i→j: a listener forwarding every connection to node j, cut or not.
#[derive(Debug)]
struct Link {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    /// The accept loop; it owns every connection's task, so aborting it ends them all.
    task: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A proxy for every ordered pair of a cluster's nodes.
#[derive(Debug)]
pub struct LinkNet {
    targets: Targets,
    links: BTreeMap<(u64, u64), Link>,
}

impl LinkNet {
    /// Binds one proxy per ordered pair (i, j), i ≠ j, of `ids`, each on an ephemeral port of
    /// 127.0.0.1. No target is known yet: until [`LinkNet::set_targets`], a connection is
    /// closed at once, as a node that is not up yet would refuse it.
    pub async fn start(ids: &[u64]) -> Result<Self, HarnessError> {
        let targets = Targets::default();
        let mut links = BTreeMap::new();
        for &from in ids {
            for &to in ids.iter().filter(|&&to| to != from) {
                let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| {
                    HarnessError::new(format!("cannot bind the proxy of link {from}→{to}: {e}"))
                })?;
                let addr = listener.local_addr().map_err(|e| {
                    HarnessError::new(format!("cannot read the proxy address of {from}→{to}: {e}"))
                })?;
                let (cut, cut_rx) = watch::channel(false);
                let task = tokio::spawn(accept_loop(listener, to, targets.clone(), cut_rx));
                links.insert((from, to), Link { addr, cut, task });
            }
        }
        Ok(Self { targets, links })
    }

    /// Sets every node's real `host:port` (node id → address); connections made from now on
    /// are forwarded there.
    pub fn set_targets(&self, addrs: BTreeMap<u64, String>) {
        *self.targets.write().unwrap_or_else(|p| p.into_inner()) = addrs;
    }

    /// Node `from`'s `--raft-dial` value: `j=<proxy of from→j>` for every other node j.
    pub fn raft_dial(&self, from: u64) -> String {
        self.links
            .iter()
            .filter(|((f, _), _)| *f == from)
            .map(|((_, to), link)| format!("{to}={}", link.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Cuts both directions between `id` and every other node.
    ///
    /// # Panics
    /// If `id` has no links (not a node of this net).
    pub fn isolate(&self, id: u64) {
        let mut cut = 0;
        for ((from, to), link) in &self.links {
            if *from == id || *to == id {
                link.cut.send_replace(true);
                cut += 1;
            }
        }
        assert!(cut > 0, "isolate({id}): node {id} has no links in this net");
    }

    /// Heals every link.
    pub fn heal(&self) {
        for link in self.links.values() {
            link.cut.send_replace(false);
        }
    }

    /// The links cut now, as ordered pairs.
    pub fn cut_links(&self) -> Vec<(u64, u64)> {
        self.links
            .iter()
            .filter(|(_, link)| *link.cut.borrow())
            .map(|(pair, _)| *pair)
            .collect()
    }
}

async fn accept_loop(listener: TcpListener, to: u64, targets: Targets, cut: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((inbound, _)) => {
                let target = targets
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&to)
                    .cloned();
                connections.spawn(serve(inbound, target, cut.clone()));
            }
            Err(_) => tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await,
        }
        // Reap finished connections so the set does not grow over a long run.
        while connections.try_join_next().is_some() {}
    }
}

/// Waits until the link is not cut; `false` if the net is gone.
async fn until_healed(cut: &mut watch::Receiver<bool>) -> bool {
    cut.wait_for(|c| !*c).await.is_ok()
}

/// Waits until the link is cut; never returns if the net is gone (the task is aborted then).
async fn until_cut(cut: &mut watch::Receiver<bool>) {
    if cut.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn serve(inbound: TcpStream, target: Option<String>, mut cut: watch::Receiver<bool>) {
    if *cut.borrow_and_update() {
        // Accepted while cut: read nothing, forward nothing, close it at the heal.
        let _held = inbound;
        until_healed(&mut cut).await;
        return;
    }
    // No target yet (the cluster is still choosing ports): close, as a refused connect would.
    let Some(target) = target else { return };
    let outbound =
        match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(&target)).await {
            Ok(Ok(stream)) => stream,
            // The target is down: close the dialler's connection, as a refused connect would.
            _ => return,
        };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let mut there = std::pin::pin!(pump(in_read, out_write, cut.clone()));
    let mut back = std::pin::pin!(pump(out_read, in_write, cut));
    // One side's clean end (EOF) is passed on and the other direction runs on; an error on
    // either side ends both.
    tokio::select! {
        done = &mut there => if done.is_ok() { let _ = back.await; },
        done = &mut back => if done.is_ok() { let _ = there.await; },
    }
}

/// Copies `from` to `to` while the link is not cut; while it is, reads and writes nothing,
/// holding whatever was read. Ends at EOF (shutting `to` down) or on an error.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut cut: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; COPY_BUF_BYTES];
    loop {
        if !until_healed(&mut cut).await {
            return Ok(());
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => read?,
            () = until_cut(&mut cut) => continue,
        };
        if n == 0 {
            return to.shutdown().await;
        }
        let mut written = 0;
        while written < n {
            if !until_healed(&mut cut).await {
                return Ok(());
            }
            // One `write` is cancel-safe (it wrote nothing if cancelled), so a cut that lands
            // mid-message holds the rest of it.
            tokio::select! {
                wrote = to.write(&buf[written..n]) => match wrote? {
                    0 => return Err(std::io::ErrorKind::WriteZero.into()),
                    w => written += w,
                },
                () = until_cut(&mut cut) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a test waits for bytes that must arrive (loopback: microseconds).
    const ARRIVES: Duration = Duration::from_secs(5);
    /// How long a test watches for bytes that must not arrive.
    const QUIET: Duration = Duration::from_millis(300);

    async fn read_exact(stream: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        tokio::time::timeout(ARRIVES, stream.read_exact(&mut buf))
            .await
            .expect("bytes arrive in time")
            .expect("read succeeds");
        buf
    }

    async fn nothing_arrives(stream: &mut TcpStream, what: &str) {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(QUIET, stream.read(&mut buf)).await {
            Err(_) => {}
            Ok(Ok(n)) => panic!("{what}: {n} bytes (or EOF if 0) came through a cut link"),
            Ok(Err(e)) => panic!("{what}: the connection failed instead of hanging: {e}"),
        }
    }

    fn proxy_addr(dial: &str, to: u64) -> String {
        dial.split(',')
            .find_map(|entry| entry.strip_prefix(&format!("{to}=")))
            .unwrap_or_else(|| panic!("no entry for {to} in {dial:?}"))
            .to_owned()
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
    async fn forwards_to_the_target_set_later_and_a_cut_holds_bytes_until_the_heal() {
        let net = LinkNet::start(&[1, 2]).await.unwrap();
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = proxy_addr(&net.raft_dial(1), 2);

        // Before the targets are known, a connection is closed.
        let mut early = TcpStream::connect(&proxy).await.unwrap();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(ARRIVES, early.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");

        net.set_targets(BTreeMap::from([(
            2,
            target.local_addr().unwrap().to_string(),
        )]));
        let mut client = TcpStream::connect(&proxy).await.unwrap();
        let (mut server, _) = tokio::time::timeout(ARRIVES, target.accept())
            .await
            .expect("the proxy dials the target")
            .unwrap();
        client.write_all(b"ping").await.unwrap();
        assert_eq!(read_exact(&mut server, 4).await, b"ping");

        net.isolate(2);
        client.write_all(b"held-up").await.unwrap();
        server.write_all(b"held-down").await.unwrap();
        nothing_arrives(&mut server, "1→2 on an existing connection").await;
        nothing_arrives(&mut client, "2→1 on an existing connection").await;
        let mut late = TcpStream::connect(&proxy).await.unwrap();
        late.write_all(b"hello?").await.unwrap();
        nothing_arrives(&mut late, "a connection made while cut").await;
        assert!(
            tokio::time::timeout(QUIET, target.accept()).await.is_err(),
            "a connection made while cut reached the target"
        );

        net.heal();
        assert_eq!(read_exact(&mut server, 7).await, b"held-up");
        assert_eq!(read_exact(&mut client, 9).await, b"held-down");
        let closed = tokio::time::timeout(ARRIVES, late.read(&mut buf))
            .await
            .expect("the blackholed connection is closed at the heal");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    }
}
