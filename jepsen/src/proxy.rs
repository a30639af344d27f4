//! The in-harness TCP proxy that stands in for iptables when the harness runs without root:
//! one listener per ordered node pair (i→j) on 127.0.0.1, forwarding to node j's real address.
//! Node i is started with `--raft-dial j=<that listener>`, so every Raft byte from i to j (and
//! j's answers on those connections) passes through it.
//!
//! Owns the listeners, the forwarding of bytes and what a cut does to them. A cut behaves like
//! an iptables DROP rule rather than a refused or reset connection: bytes on existing
//! connections stop in both directions and are held (nothing is closed, nothing is lost: they
//! flow on after the heal, like TCP retransmitting after a partition), and a connection made
//! while the link is cut is accepted and then blackholed — nothing it sends is read or
//! forwarded. Healing closes those blackholed connections, so the dialler (gRPC) reconnects,
//! and lets the held connections flow again. Must not know about Raft or choose which links to
//! cut ([`crate::nemesis::partition`] does, through [`crate::net::Firewall`]; lock-tests'
//! `LinkNet` builds its partitions on [`ProxyNet`] too, binding it before its nodes' ports are
//! known and setting the targets afterwards).
//!
//! # Slow and flaky links ([`Shape`])
//!
//! A link can also be *shaped* instead of cut. The proxy relays a TCP byte stream, so it cannot
//! drop or duplicate a packet — dropping bytes inside a relay corrupts the stream, which no real
//! network does to TCP. What loss does to a TCP connection, seen from the application, is
//! delay: the stream stalls until a retransmission fills the gap, and under heavy loss the
//! connection eventually breaks. So a shaped link holds every chunk it reads for a latency plus
//! a random jitter before writing it (chunks of one direction leave in order), stalls now and
//! then for a random time (a retransmission timeout), and now and then closes the connection
//! (both sides; the dialler reconnects). Packet-level loss and duplication are the namespace
//! mode's, through `tc netem` ([`crate::net`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Bytes read from one side before they are written to the other: a Raft append of a few
/// dozen entries fits in a handful of reads, and a small buffer bounds what a cut holds.
pub const COPY_BUF_BYTES: usize = 16 * 1024;

/// How long the proxy may take to reach the target node. On loopback a live node accepts in
/// microseconds; a killed one refuses at once; only a SIGSTOPped one with a full backlog lets
/// a connect hang, and then the dialler's own connect timeout (500 ms in lockd) decides.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next, so a
/// persistent failure does not spin a core.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// What a shaped link does to the chunks it relays (see the module doc). The default does
/// nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    /// Every chunk is held this long before it is written.
    pub delay_ms: u64,
    /// Plus a random extra in `[0, jitter_ms]` (order is kept: a chunk never overtakes).
    pub jitter_ms: u64,
    /// Chance per chunk, in parts per thousand, of a stall of `stall_ms` (a lost segment's
    /// retransmission).
    pub stall_per_mille: u32,
    /// The stall's length range, in ms.
    pub stall_ms: (u64, u64),
    /// Chance per chunk, in parts per thousand, that the connection is closed.
    pub reset_per_mille: u32,
    /// Seeds the per-connection random choices (mixed with a connection counter).
    pub seed: u64,
}

impl Shape {
    /// Whether the shape changes anything.
    pub fn is_active(&self) -> bool {
        self.delay_ms > 0
            || self.jitter_ms > 0
            || self.stall_per_mille > 0
            || self.reset_per_mille > 0
    }

    /// How long to hold one chunk and whether that includes a stall, or `None` to close the
    /// connection.
    fn hold(&self, rng: &mut StdRng) -> Option<(Duration, bool)> {
        if self.reset_per_mille > 0 && rng.gen_range(0..1000) < self.reset_per_mille {
            return None;
        }
        let mut ms = self.delay_ms;
        if self.jitter_ms > 0 {
            ms += rng.gen_range(0..=self.jitter_ms);
        }
        let stalled = self.stall_per_mille > 0 && rng.gen_range(0..1000) < self.stall_per_mille;
        if stalled {
            let (lo, hi) = self.stall_ms;
            ms += rng.gen_range(lo..=hi.max(lo));
        }
        Some((Duration::from_millis(ms), stalled))
    }
}

/// What shaped links did, counted since the proxies started (so a fault's figures are the
/// difference between its start and its heal).
#[derive(Debug, Default)]
pub struct ShapeCounters {
    held: AtomicU64,
    stalls: AtomicU64,
    resets: AtomicU64,
}

/// A reading of [`ShapeCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShapeCounts {
    /// Chunks held before they were written.
    pub held: u64,
    /// Of them, chunks stalled.
    pub stalls: u64,
    /// Connections closed.
    pub resets: u64,
}

impl ShapeCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: ShapeCounts) -> ShapeCounts {
        ShapeCounts {
            held: self.held.saturating_sub(earlier.held),
            stalls: self.stalls.saturating_sub(earlier.stalls),
            resets: self.resets.saturating_sub(earlier.resets),
        }
    }
}

impl ShapeCounters {
    fn read(&self) -> ShapeCounts {
        ShapeCounts {
            held: self.held.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
            resets: self.resets.load(Ordering::Relaxed),
        }
    }
}

/// One link i→j: a listener forwarding every connection to j's address, cut or not.
#[derive(Debug)]
pub struct LinkProxy {
    addr: SocketAddr,
    /// Where connections are forwarded; `None` until known ([`LinkProxy::bind`]). Read once per
    /// accepted connection, so a new target applies to connections made from then on.
    target: watch::Sender<Option<String>>,
    cut: watch::Sender<bool>,
    shape: watch::Sender<Shape>,
    counters: Arc<ShapeCounters>,
    /// The accept loop; it owns every connection's task, so aborting it ends them all.
    task: JoinHandle<()>,
}

impl LinkProxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards every connection to `target`
    /// (`host:port`, dialled per connection, so a restarted target is reached again).
    pub async fn start(target: &str) -> anyhow::Result<Self> {
        let proxy = Self::bind()
            .await
            .with_context(|| format!("starting the proxy for {target}"))?;
        proxy.set_target(Some(target));
        Ok(proxy)
    }

    /// Listens on an ephemeral port of 127.0.0.1 with no target yet: until
    /// [`LinkProxy::set_target`], a connection is closed at once, as a node that is not up yet
    /// would refuse it. For a harness that must bind its proxies before it knows the ports of
    /// the nodes behind them (so the OS never hands a proxy's port to a node).
    pub async fn bind() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a proxy listener")?;
        let addr = listener
            .local_addr()
            .context("reading the proxy listener's address")?;
        let (target, target_rx) = watch::channel(None);
        let (cut, cut_rx) = watch::channel(false);
        let (shape, shape_rx) = watch::channel(Shape::default());
        let counters = Arc::new(ShapeCounters::default());
        let task = tokio::spawn(accept_loop(
            listener,
            target_rx,
            cut_rx,
            shape_rx,
            Arc::clone(&counters),
        ));
        Ok(Self {
            addr,
            target,
            cut,
            shape,
            counters,
            task,
        })
    }

    /// Where the dialler connects instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address forwarded to, `None` if not known yet.
    pub fn target(&self) -> Option<String> {
        self.target.borrow().clone()
    }

    /// Forwards connections made from now on to `target` (`host:port`); `None` closes them
    /// at once. Connections already forwarded keep their target.
    pub fn set_target(&self, target: Option<&str>) {
        self.target.send_replace(target.map(str::to_owned));
    }

    /// Stops forwarding (existing connections are held, new ones blackholed).
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again; connections blackholed while cut are closed.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Whether the link is cut now.
    pub fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }

    /// Shapes the link from now on, existing connections included.
    pub fn set_shape(&self, shape: Shape) {
        self.shape.send_replace(shape);
    }

    /// The link's shape now.
    pub fn shape(&self) -> Shape {
        *self.shape.borrow()
    }

    /// What the link's shapes did so far.
    pub fn shape_counts(&self) -> ShapeCounts {
        self.counters.read()
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: watch::Receiver<Option<String>>,
    cut: watch::Receiver<bool>,
    shape: watch::Receiver<Shape>,
    counters: Arc<ShapeCounters>,
) {
    let mut connections = JoinSet::new();
    let mut accepted: u64 = 0;
    loop {
        match listener.accept().await {
            Ok((inbound, _)) => {
                let target = target.borrow().clone();
                accepted += 1;
                connections.spawn(serve(
                    inbound,
                    target,
                    cut.clone(),
                    shape.clone(),
                    Arc::clone(&counters),
                    accepted,
                ));
            }
            Err(_) => tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await,
        }
        // Reap finished connections so the set does not grow over a long run.
        while connections.try_join_next().is_some() {}
    }
}

/// Waits until the link is not cut; `false` if the proxy is gone.
async fn until_healed(cut: &mut watch::Receiver<bool>) -> bool {
    cut.wait_for(|c| !*c).await.is_ok()
}

/// Waits until the link is cut; never returns if the proxy is gone (the task is aborted).
async fn until_cut(cut: &mut watch::Receiver<bool>) {
    if cut.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn serve(
    inbound: TcpStream,
    target: Option<String>,
    mut cut: watch::Receiver<bool>,
    shape: watch::Receiver<Shape>,
    counters: Arc<ShapeCounters>,
    connection: u64,
) {
    if *cut.borrow_and_update() {
        // Accepted while cut: read nothing, forward nothing, and close it at the heal.
        let _held = inbound;
        until_healed(&mut cut).await;
        return;
    }
    // No target yet (the harness is still choosing ports): close, as a refused connect would.
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
    let mut there = std::pin::pin!(pump(
        in_read,
        out_write,
        cut.clone(),
        shape.clone(),
        Arc::clone(&counters),
        connection * 2
    ));
    let mut back = std::pin::pin!(pump(
        out_read,
        in_write,
        cut,
        shape,
        counters,
        connection * 2 + 1
    ));
    // One side's clean end (EOF) is passed on and the other direction runs on; an error on
    // either side ends both.
    tokio::select! {
        done = &mut there => if done.is_ok() { let _ = back.await; },
        done = &mut back => if done.is_ok() { let _ = there.await; },
    }
}

/// Copies `from` to `to` while the link is not cut; while it is, reads nothing and writes
/// nothing, holding whatever was read. A shaped link holds each chunk before writing it, or
/// ends the connection (an error, so both directions close). Ends at EOF (shutting `to` down)
/// or on an error.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut cut: watch::Receiver<bool>,
    shape: watch::Receiver<Shape>,
    counters: Arc<ShapeCounters>,
    stream: u64,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; COPY_BUF_BYTES];
    let mut rng: Option<StdRng> = None;
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
        let now_shape = *shape.borrow();
        if now_shape.is_active() {
            let rng = rng.get_or_insert_with(|| {
                StdRng::seed_from_u64(now_shape.seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            });
            match now_shape.hold(rng) {
                Some((hold, stalled)) => {
                    counters.held.fetch_add(1, Ordering::Relaxed);
                    if stalled {
                        counters.stalls.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(hold).await;
                }
                None => {
                    counters.resets.fetch_add(1, Ordering::Relaxed);
                    return Err(std::io::ErrorKind::ConnectionReset.into());
                }
            }
        }
        let mut written = 0;
        while written < n {
            if !until_healed(&mut cut).await {
                return Ok(());
            }
            // A single `write` is cancel-safe (it wrote nothing if cancelled), so a cut that
            // lands mid-message holds the rest of it.
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

/// A proxy for every ordered pair of nodes.
#[derive(Debug)]
pub struct ProxyNet {
    links: BTreeMap<(u64, u64), LinkProxy>,
}

impl ProxyNet {
    /// Starts one [`LinkProxy`] per ordered pair (i, j), i ≠ j, of `nodes` (id → the node's
    /// real `host:port`), forwarding to j.
    pub async fn start(nodes: &BTreeMap<u64, String>) -> anyhow::Result<Self> {
        let ids: Vec<u64> = nodes.keys().copied().collect();
        let net = Self::bind(&ids).await?;
        net.set_targets(nodes);
        Ok(net)
    }

    /// Binds one [`LinkProxy`] per ordered pair (i, j), i ≠ j, of `ids`, with no target yet
    /// (see [`LinkProxy::bind`]): for a harness that chooses its nodes' ports after binding.
    pub async fn bind(ids: &[u64]) -> anyhow::Result<Self> {
        let mut links = BTreeMap::new();
        for &from in ids {
            for &to in ids.iter().filter(|&&to| to != from) {
                let proxy = LinkProxy::bind()
                    .await
                    .with_context(|| format!("starting the proxy of link {from}→{to}"))?;
                links.insert((from, to), proxy);
            }
        }
        Ok(Self { links })
    }

    /// Points every link i→j at `nodes[j]` (id → `host:port`) for connections made from now
    /// on; a link to a node missing from `nodes` closes its connections.
    pub fn set_targets(&self, nodes: &BTreeMap<u64, String>) {
        for ((_, to), proxy) in &self.links {
            proxy.set_target(nodes.get(to).map(String::as_str));
        }
    }

    /// Node `from`'s `--raft-dial` value: `j=<proxy of from→j>` for every other node j.
    pub fn raft_dial(&self, from: u64) -> String {
        self.links
            .iter()
            .filter(|((f, _), _)| *f == from)
            .map(|((_, to), proxy)| format!("{to}={}", proxy.addr()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The proxy of link `from`→`to`.
    pub fn link(&self, from: u64, to: u64) -> Option<&LinkProxy> {
        self.links.get(&(from, to))
    }

    /// Cuts every link in `links` (pairs of node ids), both directions.
    pub fn cut(&self, links: &[(u64, u64)]) -> anyhow::Result<()> {
        for &(a, b) in links {
            for (from, to) in [(a, b), (b, a)] {
                self.link(from, to)
                    .with_context(|| format!("no proxy for link {from}→{to}"))?
                    .cut();
            }
        }
        Ok(())
    }

    /// Heals every link.
    pub fn heal(&self) {
        for proxy in self.links.values() {
            proxy.heal();
        }
    }

    /// Shapes every link in `links` (pairs of node ids), both directions.
    pub fn shape(&self, links: &[(u64, u64)], shape: Shape) -> anyhow::Result<()> {
        for &(a, b) in links {
            for (from, to) in [(a, b), (b, a)] {
                self.link(from, to)
                    .with_context(|| format!("no proxy for link {from}→{to}"))?
                    .set_shape(shape);
            }
        }
        Ok(())
    }

    /// What every link's shapes did so far, summed.
    pub fn shape_counts(&self) -> ShapeCounts {
        self.links
            .values()
            .map(LinkProxy::shape_counts)
            .fold(ShapeCounts::default(), |a, b| ShapeCounts {
                held: a.held + b.held,
                stalls: a.stalls + b.stalls,
                resets: a.resets + b.resets,
            })
    }

    /// Removes every link's shape.
    pub fn unshape(&self) {
        for proxy in self.links.values() {
            proxy.set_shape(Shape::default());
        }
    }

    /// The links cut now, as ordered pairs.
    pub fn cut_links(&self) -> Vec<(u64, u64)> {
        self.links
            .iter()
            .filter(|(_, p)| p.is_cut())
            .map(|(link, _)| *link)
            .collect()
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

    /// A target, the proxy in front of it, and one connection through it with the target's
    /// end of it.
    async fn setup() -> (TcpListener, LinkProxy, TcpStream, TcpStream) {
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = LinkProxy::start(&target.local_addr().unwrap().to_string())
            .await
            .unwrap();
        let client = TcpStream::connect(proxy.addr()).await.unwrap();
        let (server, _) = tokio::time::timeout(ARRIVES, target.accept())
            .await
            .expect("the proxy dials the target")
            .unwrap();
        (target, proxy, client, server)
    }

    #[tokio::test]
    async fn bytes_flow_both_ways() {
        let (_target, _proxy, mut client, mut server) = setup().await;
        client.write_all(b"ping").await.unwrap();
        assert_eq!(read_exact(&mut server, 4).await, b"ping");
        server.write_all(b"pong!").await.unwrap();
        assert_eq!(read_exact(&mut client, 5).await, b"pong!");
        // A message larger than the copy buffer arrives whole.
        let big: Vec<u8> = (0..COPY_BUF_BYTES * 3).map(|i| (i % 251) as u8).collect();
        client.write_all(&big).await.unwrap();
        assert_eq!(read_exact(&mut server, big.len()).await, big);
        // EOF is passed on.
        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(ARRIVES, server.read_to_end(&mut rest))
            .await
            .expect("EOF arrives")
            .unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn a_cut_holds_existing_connections_and_blackholes_new_ones_until_the_heal() {
        let (target, proxy, mut client, mut server) = setup().await;
        client.write_all(b"before").await.unwrap();
        assert_eq!(read_exact(&mut server, 6).await, b"before");

        proxy.cut();
        assert!(proxy.is_cut());
        client.write_all(b"held-up").await.unwrap();
        server.write_all(b"held-down").await.unwrap();
        nothing_arrives(&mut server, "client→target on an existing connection").await;
        nothing_arrives(&mut client, "target→client on an existing connection").await;

        // A new connection is accepted (like a SYN into a DROP rule, it does not fail) but
        // gets nothing through, and the target never sees it.
        let mut late = TcpStream::connect(proxy.addr()).await.unwrap();
        late.write_all(b"hello?").await.unwrap();
        nothing_arrives(&mut late, "a connection made while cut").await;
        assert!(
            tokio::time::timeout(QUIET, target.accept()).await.is_err(),
            "a connection made while cut reached the target"
        );

        proxy.heal();
        // The held bytes flow on, in order, on the same connection.
        assert_eq!(read_exact(&mut server, 7).await, b"held-up");
        assert_eq!(read_exact(&mut client, 9).await, b"held-down");
        client.write_all(b"after").await.unwrap();
        assert_eq!(read_exact(&mut server, 5).await, b"after");

        // The blackholed connection is closed, so its dialler reconnects.
        let mut buf = [0u8; 16];
        let closed = tokio::time::timeout(ARRIVES, late.read(&mut buf))
            .await
            .expect("the blackholed connection is closed at the heal");
        assert!(
            matches!(closed, Ok(0) | Err(_)),
            "the blackholed connection got data: {closed:?}"
        );

        // And a new connection works.
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        let (mut fresh_server, _) = tokio::time::timeout(ARRIVES, target.accept())
            .await
            .expect("a connection after the heal reaches the target")
            .unwrap();
        fresh.write_all(b"new").await.unwrap();
        assert_eq!(read_exact(&mut fresh_server, 3).await, b"new");
        fresh_server.write_all(b"ok").await.unwrap();
        assert_eq!(read_exact(&mut fresh, 2).await, b"ok");
    }

    #[tokio::test]
    async fn a_shaped_link_delays_in_order_and_may_reset() {
        let (_target, proxy, mut client, mut server) = setup().await;
        proxy.set_shape(Shape {
            delay_ms: 150,
            jitter_ms: 50,
            seed: 1,
            ..Shape::default()
        });
        let sent = std::time::Instant::now();
        for chunk in [b"one".as_slice(), b"two", b"three"] {
            client.write_all(chunk).await.unwrap();
        }
        // Every byte arrives, in order, none sooner than the latency.
        assert_eq!(read_exact(&mut server, 11).await, b"onetwothree");
        assert!(sent.elapsed() >= Duration::from_millis(150));
        proxy.set_shape(Shape {
            reset_per_mille: 1000,
            seed: 1,
            ..Shape::default()
        });
        client.write_all(b"boom").await.unwrap();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(ARRIVES, server.read(&mut buf))
            .await
            .expect("the connection is closed in time");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
        // Unshaped, a new connection relays at once.
        proxy.set_shape(Shape::default());
        assert!(!proxy.shape().is_active());
        let counts = proxy.shape_counts();
        assert!(counts.held >= 1 && counts.resets == 1, "{counts:?}");
    }

    #[tokio::test]
    async fn a_proxy_bound_without_a_target_closes_connections_until_it_gets_one() {
        let proxy = LinkProxy::bind().await.unwrap();
        assert_eq!(proxy.target(), None);
        let mut early = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(ARRIVES, early.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");

        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target_addr = target.local_addr().unwrap().to_string();
        proxy.set_target(Some(&target_addr));
        assert_eq!(proxy.target().as_deref(), Some(target_addr.as_str()));
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        let (mut server, _) = tokio::time::timeout(ARRIVES, target.accept())
            .await
            .expect("the proxy dials the target it was given")
            .unwrap();
        client.write_all(b"ping").await.unwrap();
        assert_eq!(read_exact(&mut server, 4).await, b"ping");
    }

    #[tokio::test]
    async fn a_connection_to_a_dead_target_is_closed() {
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = target.local_addr().unwrap().to_string();
        drop(target);
        let proxy = LinkProxy::start(&addr).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 8];
        let closed = tokio::time::timeout(ARRIVES, client.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    }

    #[tokio::test]
    async fn the_net_cuts_both_directions_of_exactly_the_links_named() {
        let nodes: BTreeMap<u64, String> = (1..=3)
            .map(|id| (id, format!("127.0.0.1:{}", 9000 + id)))
            .collect();
        let net = ProxyNet::start(&nodes).await.unwrap();
        assert_eq!(net.links.len(), 6);
        let dial = net.raft_dial(1);
        assert!(dial.starts_with("2=127.0.0.1:"), "{dial}");
        assert!(dial.contains(",3=127.0.0.1:"), "{dial}");
        assert!(!dial.contains("1="), "{dial}");
        assert_eq!(
            net.link(1, 2).unwrap().target().as_deref(),
            Some("127.0.0.1:9002")
        );

        net.cut(&[(1, 2)]).unwrap();
        assert_eq!(net.cut_links(), vec![(1, 2), (2, 1)]);
        net.cut(&[(1, 3)]).unwrap();
        assert_eq!(net.cut_links(), vec![(1, 2), (1, 3), (2, 1), (3, 1)]);
        net.heal();
        assert!(net.cut_links().is_empty());
        assert!(net.cut(&[(1, 4)]).is_err());
    }
}
