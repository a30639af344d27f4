//! [`DbLink`]: a TCP forwarder between a stateless node and its database (PostgreSQL or one
//! etcd member), so a test can cut the node off its backend and give it back.
//!
//! A cut resets the link the way a database restart or a dropped NAT entry does: every open
//! connection is closed at once in both directions and every connection made while cut is
//! closed as soon as it is accepted, so the node's driver sees errors (a closed connection, an
//! immediate end of stream), not silence. A heal forwards new connections again; the driver
//! reconnects on its own. (lock-jepsen's `LinkProxy` models the other kind of outage, a DROP
//! rule that holds bytes; a database whose connections hang is covered by the statement
//! timeouts of the stores, not here.)
//!
//! Owns the listener and the forwarding tasks only; it knows nothing about what flows through.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::HarnessError;

/// Pause after a failed `accept` (e.g. out of file descriptors) before the next, so a
/// persistent failure does not spin a core.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// One forwarder from a loopback port to `upstream`.
#[derive(Debug)]
pub struct DbLink {
    addr: SocketAddr,
    upstream: SocketAddr,
    cut: watch::Sender<bool>,
    /// The accept loop; it owns every connection's task, so aborting it ends them all.
    task: JoinHandle<()>,
}

impl DbLink {
    /// Listens on a free port of 127.0.0.1 and forwards every connection to `upstream`
    /// (dialled per connection).
    pub async fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| HarnessError::new(format!("cannot bind a proxy for {upstream}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| HarnessError::new(format!("cannot read the proxy's address: {e}")))?;
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, upstream, cut_rx));
        Ok(Self {
            addr,
            upstream,
            cut,
            task,
        })
    }

    /// The address the node dials instead of the database.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The database address behind the link.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Closes every open connection and every new one until [`DbLink::heal`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards new connections again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Whether the link is cut now.
    pub fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }
}

impl Drop for DbLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, cut: watch::Receiver<bool>) {
    // Dropped with the accept loop, which aborts every connection task.
    let mut conns = JoinSet::new();
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            // Out of descriptors or similar: the node sees refused connections, which is a
            // cut too; keep serving once the condition clears.
            tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            continue;
        };
        if *cut.borrow() {
            drop(inbound);
            continue;
        }
        conns.spawn(forward(inbound, upstream, cut.clone()));
        // Reap finished connections so a long test does not accumulate them.
        while conns.try_join_next().is_some() {}
    }
}

/// Copies bytes both ways until either side closes or the link is cut (then both sockets
/// are dropped, which closes them).
async fn forward(mut inbound: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|cut| *cut) => {}
    }
}
